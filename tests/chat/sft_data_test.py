"""prepare-data --format sft against transformers' apply_chat_template (test-only oracle).

Two tokenizer directories are built here as the real models ship them: a Qwen3-style one
(tokenizer.json with NFC + Qwen's split regex, <|im_start|>/<|im_end|>/<|endoftext|> special,
<think>, <tool_call>, ... added but not special; tokenizer_config.json with eos_token
<|im_end|> and Qwen3's chat template, chat_templates/qwen3.jinja) and an OLMoE-Instruct-style one
(GPT-NeoX's NFC + ByteLevel, <|endoftext|> as BOS and EOS, the Tulu chat template,
chat_templates/olmoe.jinja) and a Mixtral-Instruct-style one (Llama-2's Prepend/Replace BPE with
byte fallback, <s>/</s>, Mixtral-8x7B-Instruct's template, chat_templates/mixtral.jinja, which has
no generation prompt: a turn starts where the earlier messages' rendering ends). For 50 chat
examples each (system prompts, several turns, reasoning
in <think> blocks, tool calls with a tools list, ShareGPT "conversations", conversational
prompt/completion; multilingual), the ids prepare-data writes equal
apply_chat_template(messages, tokenize=True) and the loss mask equals the assistant spans computed
from transformers' rendered text: from the end of the template's generation prompt (what
add_generation_prompt appends) to the end of the first special token after it, mapped to tokens by
their offsets. Then plain prompt/completion (TRL's format: the completion and the EOS trained),
bad examples refused with file:line, and a short training run on the SFT data (metrics count the
answer tokens; evaluation runs on them).

usage: sft_data_test.py MOE_TRAIN_BINARY TESTS_DATA_DIR
"""
import json
import pathlib
import random
import subprocess
import sys
import tempfile

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer

from sft_reference import read_docs, rendered

BIN, DATA = sys.argv[1], pathlib.Path(sys.argv[2])
QWEN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+")
WORDS = ("the of and to in is that it for was on are as with his they at be this from what how why "
         "и в не на что он как это 中文 日本語 数据 模型 训练 مرحبا بالعالم 😀 🚀 café naïve 42 3.14 "
         "weather Paris tomorrow answer question please explain step").split()


def sentence(rnd, n):
    return " ".join(rnd.choice(WORDS) for _ in range(n)) + rnd.choice([".", "?", "!", "\n\nMore: x", ""])


def build(kind, tmp):
    rnd = random.Random(1)
    corpus = [sentence(rnd, 40) for _ in range(3000)]
    if kind == "mixtral":  # Llama-2 style: Prepend/Replace, no pre-tokenizer, byte fallback
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
        tok.train_from_iterator(corpus, trainer)
        j = json.loads(tok.to_str())
        for b in range(256):
            j["model"]["vocab"].setdefault(f"<0x{b:02X}>", len(j["model"]["vocab"]))
        d = tmp / kind
        d.mkdir()
        (d / "tokenizer.json").write_text(json.dumps(j, ensure_ascii=False))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20,
                  "chat_template": (DATA / "chat_templates" / "mixtral.jinja").read_text(),
                  "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
        (d / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
        return d, ["<unk>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    if kind == "qwen3":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        added = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        special = ["<|endoftext|>", "<|padding|>"]
        added = []
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens([AddedToken(a, special=False, normalized=False) for a in added])
    d = tmp / kind
    d.mkdir()
    tok.save(str(d / "tokenizer.json"))
    template = (DATA / "chat_templates" / f"{kind}.jinja").read_text()
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template,
              "model_max_length": 1 << 20}
    if kind == "qwen3":  # Qwen3's: no BOS, <|im_end|> ends a turn and is the EOS
        config.update(bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    else:  # OLMoE-Instruct's: <|endoftext|> for both
        config.update(bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<|padding|>")
    (d / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    return d, special


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}, "days": {"type": "integer"}},
                                               "required": ["city"]}}}]


def example(rnd, kind, i):
    """One JSONL record and the messages (and tools, first trained message) it means."""
    msgs = []
    if rnd.random() < 0.4 and kind != "mixtral":  # Mixtral's template has no system role
        msgs.append({"role": "system", "content": sentence(rnd, 8)})
    tools = None
    for turn in range(rnd.randint(1, 3)):
        msgs.append({"role": "user", "content": sentence(rnd, rnd.randint(3, 30))})
        answer = sentence(rnd, rnd.randint(2, 40))
        if kind == "qwen3" and rnd.random() < 0.3:
            answer = f"<think>\n{sentence(rnd, 10)}\n</think>\n\n{answer}"
        msgs.append({"role": "assistant", "content": answer})
    if kind == "qwen3" and i % 7 == 3:  # a tool call and its response, then the final answer
        tools = TOOLS
        msgs.insert(len(msgs) - 1, {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]})
        msgs.insert(len(msgs) - 1, {"role": "tool", "content": json.dumps({"temp_c": 21.5, "sky": "clear"})})
    first = 0
    if i % 10 == 4:  # ShareGPT
        rec = {"conversations": [{"from": {"user": "human", "assistant": "gpt"}.get(m["role"], m["role"]),
                                  "value": m["content"]} for m in msgs if "tool_calls" not in m and m["role"] != "tool"]}
        msgs = [{"role": {"human": "user", "gpt": "assistant"}.get(c["from"], c["from"]), "content": c["value"]}
                for c in rec["conversations"]]
        tools = None
    elif i % 10 == 7:  # conversational prompt/completion: the prompt's answers are not trained
        cut = len(msgs) - 1
        rec = {"prompt": msgs[:cut], "completion": msgs[cut:]}
        first = cut
    else:
        rec = {"messages": msgs}
    if tools:
        rec["tools"] = tools
    return rec, msgs, tools, first


def reference(tok, special, msgs, tools, first):
    """transformers' ids, and the mask from its rendered text (see the module docstring)."""
    text, ids, enc = rendered(tok, msgs, tools)
    k = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    without = tok.apply_chat_template(msgs[:k], tools=tools, tokenize=False) if k else ""
    with_prompt = tok.apply_chat_template(msgs[:k], tools=tools, tokenize=False, add_generation_prompt=True)
    assert with_prompt.startswith(without)
    gen = with_prompt[len(without):]
    spans, at = [], 0
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        if gen:
            s = text.index(gen, at) + len(gen)
        else:  # no generation prompt (Mixtral): the turn starts where the earlier messages end
            head = tok.apply_chat_template(msgs[:i], tokenize=False) if i else ""
            assert text.startswith(head)
            s = len(head)
        ends = [text.find(t, s) + len(t) for t in special if text.find(t, s) >= 0]
        e = min(ends) if ends else len(text)
        if i >= first:
            spans.append((len(text[:s].encode()), len(text[:e].encode())))
        at = e
    # Offsets are in characters; compare in bytes as the ids' text is UTF-8.
    char_to_byte = np.cumsum([0] + [len(c.encode()) for c in text])
    mask = []
    for a, b in enc["offset_mapping"]:
        ba, bb = char_to_byte[a], char_to_byte[b]
        mask.append(int(any(bb > s and ba < e for s, e in spans)))
    return list(ids), mask


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    for kind in ("qwen3", "olmoe", "mixtral"):
        tok_dir, special = build(kind, tmp)
        tok = AutoTokenizer.from_pretrained(str(tok_dir))
        rnd = random.Random(5)
        records = [example(rnd, kind, i) for i in range(50)]
        (tmp / f"{kind}.jsonl").write_text("".join(json.dumps(r[0], ensure_ascii=False) + "\n" for r in records))
        out = tmp / f"ds-{kind}"
        r = subprocess.run([BIN, "prepare-data", tmp / f"{kind}.jsonl", "--out", out, "--format", "sft",
                            "--tokenizer-from", tok_dir, "--append-eod"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        docs, manifest = read_docs(out)
        assert manifest["loss_mask"] is True and len(docs) == 50, (manifest, len(docs))
        eod = manifest["eod_id"]
        targets = 0
        for i, ((rec, msgs, tools, first), (ids, mask)) in enumerate(zip(records, docs)):
            want_ids, want_mask = reference(tok, special, msgs, tools, first)
            if ids[-1] == eod and (len(want_ids) == 0 or want_ids[-1] != eod):
                assert mask[-1] == 0  # the end-of-document token is not a target
                ids, mask = ids[:-1], mask[:-1]
            assert list(ids) == want_ids, (kind, i, rec, tok.decode(ids), tok.decode(want_ids))
            if list(mask) != want_mask:
                bad = [j for j in range(len(mask)) if mask[j] != want_mask[j]]
                raise SystemExit(f"FAIL {kind} example {i}: mask differs at tokens {bad[:10]}: "
                                 f"{[tok.decode([ids[j]]) for j in bad[:10]]}")
            assert sum(want_mask) > 0
            targets += sum(want_mask)
        assert manifest["target_tokens"] == targets, (manifest["target_tokens"], targets)
        kinds = {"tools": sum(1 for r in records if r[2]), "sharegpt": sum(1 for r in records if "conversations" in r[0]),
                 "prompt/completion": sum(1 for r in records if "prompt" in r[0])}
        print(f"{kind}: 50 chat examples ({kinds}): ids equal apply_chat_template, masks equal the assistant "
              f"spans ({targets} target tokens of {sum(len(x[0]) for x in docs)})")

    # TRL's plain prompt/completion: prompt untrained, completion + EOS trained.
    tok_dir = tmp / "qwen3"
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    pairs = [("Translate to French: the weather", " le temps"), ("2 + 2 =", " 4"), ("中文 数据", "模型 训练")]
    (tmp / "pc.jsonl").write_text("".join(json.dumps({"prompt": p, "completion": c}, ensure_ascii=False) + "\n"
                                          for p, c in pairs))
    out = tmp / "ds-pc"
    r = subprocess.run([BIN, "prepare-data", tmp / "pc.jsonl", "--out", out, "--format", "sft",
                        "--tokenizer-from", tok_dir], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    docs, _ = read_docs(out)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    for (p, c), (ids, mask) in zip(pairs, docs):
        full = tok(p + c, add_special_tokens=False)["input_ids"]
        n = len(tok(p, add_special_tokens=False)["input_ids"])
        assert list(ids) == full + [eos], (p, c, ids, full)
        assert list(mask) == [0] * n + [1] * (len(full) - n) + [1], (p, c, mask)
    print(f"prompt/completion: {len(pairs)} examples: prompt untrained, completion and EOS trained")

    # Bad examples: exit 2 naming file:line, nothing written; --skip-bad-lines skips them.
    lines = ['{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}',
             '{"messages": [{"role": "user", "content": "only a question"}]}']
    (tmp / "bad.jsonl").write_text("\n".join(lines) + "\n")
    r = subprocess.run([BIN, "prepare-data", tmp / "bad.jsonl", "--out", tmp / "bad-out", "--format", "sft",
                        "--tokenizer-from", tok_dir], capture_output=True, text=True)
    assert r.returncode == 2 and "bad.jsonl:2: no assistant message" in r.stderr, r.stderr
    assert not (tmp / "bad-out").exists()
    r = subprocess.run([BIN, "prepare-data", tmp / "bad.jsonl", "--out", tmp / "skip-out", "--format", "sft",
                        "--tokenizer-from", tok_dir, "--skip-bad-lines"], capture_output=True, text=True)
    assert r.returncode == 0 and json.loads((tmp / "skip-out" / "manifest.json").read_text())["skipped_lines"] == 1
    (tmp / "raise.jinja").write_text("{{ raise_exception('Conversation roles must alternate') }}")
    (tmp / "good.jsonl").write_text(lines[0] + "\n")
    r = subprocess.run([BIN, "prepare-data", tmp / "good.jsonl", "--out", tmp / "raise-out", "--format", "sft",
                        "--tokenizer-from", tok_dir, "--chat-template", tmp / "raise.jinja"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "good.jsonl:1:" in r.stderr and "roles must alternate" in r.stderr, r.stderr
    assert not (tmp / "raise-out").exists()
    print(f"refused: {r.stderr.strip()[:160]}")

    # A short training run on the OLMoE-style SFT data: every step reports its target tokens,
    # fewer than the tokens it saw; evaluation runs on the answers.
    big = [example(random.Random(i), "olmoe", i)[0] for i in range(400)]
    (tmp / "train.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in big))
    out = tmp / "ds-train"
    r = subprocess.run([BIN, "-q", "prepare-data", tmp / "train.jsonl", "--out", out, "--format", "sft",
                        "--tokenizer-from", tmp / "olmoe", "--append-eod", "--valid-fraction", "0.1"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    m = json.loads((out / "manifest.json").read_text())
    cfg = {"train_batch_size": 4, "optimizer": {"params": {"lr": 3e-3}}, "steps_per_print": 1,
           "model": {"vocab_size": m["vocab_size"], "seq_len": 64, "hidden_size": 32, "num_layers": 2, "num_heads": 2},
           "moe": {"num_experts": 4, "top_k": 2, "expert_hidden_size": 64},
           "data": {"path": str(out), "reset_attention_at_eod": True},
           "training": {"output_dir": str(tmp / "run"), "train_iters": 6, "eval_interval": 6, "eval_iters": 2}}
    (tmp / "sft.json").write_text(json.dumps(cfg))
    r = subprocess.run([BIN, "train", "--config", tmp / "sft.json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    recs = [json.loads(x) for x in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in recs if x.get("type") == "train"]
    evals = [x for x in recs if x.get("type") == "eval"]
    assert len(train) == 6 and all(0 < x["target_tokens"] < 4 * 64 for x in train), train
    assert evals and 0 < evals[-1]["tokens"] < 2 * 4 * 64, evals
    print(f"training on SFT data: target tokens per step {[x['target_tokens'] for x in train]} of {4 * 64}; "
          f"eval on {evals[-1]['tokens']} answer tokens, accuracy {evals[-1]['accuracy']:.3f}")

    # eval --dump-logits on SFT data: token ids as the tokenizer gave them (no loader flag bits)
    # and the loss mask beside them, 0 on the prompts and 1 on the answers.
    dump = tmp / "sft-logits.safetensors"
    r = subprocess.run([BIN, "eval", "--config", tmp / "sft.json", "--dump-logits", dump],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    from safetensors.numpy import load_file
    d = load_file(dump)
    ids, mask = d["tokens"], d["loss_mask"]
    assert ids.shape == mask.shape and ids.shape[1] == 65, (ids.shape, mask.shape)
    assert 0 <= ids.min() and ids.max() < m["vocab_size"], (ids.min(), ids.max())
    targets = int(mask[:, 1:].sum())
    assert 0 < targets < mask[:, 1:].size, targets
    assert targets == json.loads(r.stdout)["tokens"], (targets, r.stdout)
    print(f"eval --dump-logits on SFT data: ids within the vocabulary ({ids.max()} < {m['vocab_size']}), "
          f"loss_mask marks {targets} answer tokens of {mask[:, 1:].size}, the tokens eval scored")
print("ok")
