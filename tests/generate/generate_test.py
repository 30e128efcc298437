"""`moe-train generate` against transformers' generate, family by family, on tiny random models
made here from transformers' config classes (tests/hf/tiny_families.py) with a byte-level BPE
tokenizer and a ChatML template trained here (nothing downloaded):

- greedy: 4 requests of 3..30 tokens (two longer than gpt-oss's 16-token window), batched and left-
  padded, 32 new tokens each: token-identical to generate(do_sample=False) on the same left-padded
  batch, and the same text as the tokenizer's decode; one request is a chat rendered by the template;
- sampling: the processed scores of one step (repetition penalty, temperature, top-k, top-p, min-p)
  equal transformers' output_scores within 1e-6 after the softmax;
- trained checkpoints: a LoRA checkpoint (adapters unmerged) and a LoRA over a 4-bit base generate
  what transformers generates from their `export-hf --merge` (the 4-bit base dequantized), and the
  adapters change what is generated;
- chat: driven through a pseudo-terminal for two turns and ended with Ctrl-D, each turn's prompt is
  apply_chat_template(add_generation_prompt=True) of the conversation so far, and its greedy reply is
  transformers' (the reply streamed to the terminal as it is generated); a second session on its
  controlling terminal: Ctrl-C ends the streaming reply ("[stopped]"), then the session, exit 0;
- the same greedy check for Mixtral with a Llama-2-style tokenizer (byte fallback, the Replace /
  ByteFallback / Fuse / Strip decoder, a BOS from the post-processor);
- bad input: no tokenizer, a prompt longer than the context, a malformed JSONL line: exit 2, one
  line naming it, no output file.

The sampling, chat, trained-checkpoint and bad-input checks run on the first family named (all
families: Mixtral). Usage: generate_test.py MOE_TRAIN_BIN [FAMILY ...]"""
import json
import os
import pathlib
import pty
import select
import subprocess
import sys
import tempfile
import time

try:
    import torch
    import transformers
    from tokenizers import (AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors,
                            trainers)
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "hf"))
import tiny_families  # noqa: E402

BIN = sys.argv[1]
ALL = {**tiny_families.FAMILIES, **tiny_families.MLA_FAMILIES, **tiny_families.GLM_FAMILIES,
       **tiny_families.HYBRID_FAMILIES, **tiny_families.VL_FAMILIES, **tiny_families.SIGMOID_FAMILIES,
       **tiny_families.SOFTMAX_BIAS_FAMILIES, **tiny_families.MISTRAL4_FAMILIES,
       **tiny_families.GEMMA4_FAMILIES, **tiny_families.MAMBA_FAMILIES}
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXTS = ["Hi", "the quick brown fox", "ein Satz über das Wetter, mit Umlauten: äöü",
         "def f(x):\n    return x * 2  # a longer prompt that passes the sliding window"]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}]


def run(*args, check=True):
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"moe-train {' '.join(map(str, args))}: exit {p.returncode}\n{p.stderr}")
    return p


def tokenizer_files(d):
    """A byte-level BPE of 300 tokens (+ 3 special ones, ids < 320) and a ChatML template."""
    corpus = [" ".join(TEXTS) + " " + c["content"] for c in CHAT] * 50
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=300, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "chat_template": CHATML, "model_max_length": 4096}))
    assert tok.get_vocab_size() <= 320


def llama2_tokenizer_files(d):
    """Llama-2 / Mixtral's SentencePiece-converted BPE: Prepend + Replace normalizer, byte fallback
    (the 256 <0xXX> tokens), BOS by the post-processor, the decoder Sequence[Replace, ByteFallback,
    Fuse, Strip]; <unk> <s> </s> are ids 0 1 2 (the tiny models' pad, bos, eos)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.train_from_iterator([" ".join(TEXTS)] * 20, trainers.BpeTrainer(
        vocab_size=60, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False))
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    j["decoder"] = json.loads(decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                                 decoders.Fuse(), decoders.Strip(" ", 1, 0)]).__getstate__())
    j["post_processor"] = json.loads(processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]).__getstate__())
    d.mkdir(parents=True, exist_ok=True)
    (d / "tokenizer.json").write_text(json.dumps(j))
    assert len(vocab) <= 320, len(vocab)
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": "<unk>", "chat_template": CHATML, "model_max_length": 4096}))


def tiny_model(family, src, tok_dir, **changes):
    if family in tiny_families.VL_FAMILIES:  # the release's class: the text model in text_config
        text_cls, text_extra = tiny_families.HYBRID_FAMILIES["qwen3_5_moe_text"]
        vl_cls, vl_extra = tiny_families.VL_FAMILIES[family]
        torch.manual_seed(5)
        text = text_cls(**{**tiny_families.HYBRID, **text_extra, **changes})
        model = transformers.Qwen3_5MoeForConditionalGeneration(
            vl_cls(text_config=text.to_dict(), tie_word_embeddings=False, **vl_extra)).eval()
        model.save_pretrained(src)
        for f in tok_dir.iterdir():
            (src / f.name).write_bytes(f.read_bytes())
        return model
    cls, extra = ALL[family]
    base = tiny_families.HYBRID if family in tiny_families.HYBRID_FAMILIES else tiny_families.COMMON
    if family in tiny_families.MLA_FAMILIES or family in tiny_families.MISTRAL4_FAMILIES:
        base = tiny_families.COMMON
    if family in tiny_families.GEMMA4_FAMILIES or family in tiny_families.MAMBA_FAMILIES:
        base = {}  # its dict is whole
    torch.manual_seed(5)
    model = transformers.AutoModelForCausalLM.from_config(cls(**{**base, **extra, **changes})).eval()
    model.save_pretrained(src)
    for f in tok_dir.iterdir():
        (src / f.name).write_bytes(f.read_bytes())
    return model


def hf_tokenizer(tok_dir):
    tok = transformers.AutoTokenizer.from_pretrained(tok_dir)
    tok.padding_side = "left"
    return tok


def prompts_of(tok):
    chat = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    return [tok(t)["input_ids"] for t in TEXTS[:3]] + [tok(chat, add_special_tokens=False)["input_ids"]]


def their_generation(model, tok, prompts, **kw):
    batch = tok.pad({"input_ids": prompts}, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=32, pad_token_id=tok.pad_token_id, **kw)
    return batch, out


def check_greedy(family, tmp, tok_dir, tag="", **changes):
    src = tmp / (family + tag)
    model = tiny_model(family, src, tok_dir, **changes)
    tok = hf_tokenizer(tok_dir)
    prompts = prompts_of(tok)
    requests = tmp / f"{family}{tag}.jsonl"
    requests.write_text("".join(json.dumps({"id": i, "prompt": t}) + "\n" for i, t in enumerate(TEXTS[:3]))
                        + json.dumps({"id": 3, "messages": CHAT}) + "\n")
    out = tmp / f"{family}{tag}.out.jsonl"
    run("generate", "--checkpoint", src, "--input", requests, "--greedy", "-n", 32, "--batch-size", 4,
        "--output", out)
    ours = [json.loads(line) for line in out.read_text().splitlines()]
    batch, theirs = their_generation(model, tok, prompts, do_sample=False)
    L = batch["input_ids"].shape[1]
    eos = set(model.generation_config.eos_token_id if isinstance(model.generation_config.eos_token_id, list)
              else [model.generation_config.eos_token_id])
    for i, o in enumerate(ours):
        assert o["id"] == i and o["prompt_tokens"] == len(prompts[i]), o
        new = theirs[i, L:].tolist()
        if any(t in eos for t in new):  # transformers pads a finished row after its EOS
            new = new[:next(k for k, t in enumerate(new) if t in eos) + 1]
        assert o["token_ids"] == new, f"{family} request {i}: ours {o['token_ids']} transformers {new}"
        assert o["finish_reason"] == ("stop" if new[-1] in eos else "length"), o
        assert o["text"] == tok.decode(new, skip_special_tokens=True), (o["text"], tok.decode(new))
    print(f"  {family}{tag}: 4 requests (prompts of {[len(p) for p in prompts]} tokens), 32 greedy tokens each: "
          "token-identical to transformers' generate, same text")
    return model, tok, src, prompts


def check_sampling(family, model, tok, src, tmp, prompts):
    settings = dict(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, repetition_penalty=1.3,
                    min_new_tokens=1)
    scores = tmp / "scores.safetensors"
    req = tmp / "sample.jsonl"
    req.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in TEXTS[:3]))
    run("generate", "--checkpoint", src, "--input", req, "--sample", "--seed", 3, "-n", 1,
        "--temperature", 0.7, "--top-k", 40, "--top-p", 0.9, "--min-p", 0.05, "--repetition-penalty", 1.3,
        "--min-new-tokens", 1,
        "--scores-out", scores, "--output", tmp / "sample.out.jsonl")
    from safetensors.torch import load_file
    ours = load_file(scores)["scores"][0]
    batch = tok.pad({"input_ids": prompts[:3]}, return_tensors="pt")
    with torch.no_grad():
        g = model.generate(**batch, max_new_tokens=1, do_sample=True, output_scores=True,
                           return_dict_in_generate=True, pad_token_id=tok.pad_token_id, **settings)
    theirs = g.scores[0]
    kept_ours, kept_theirs = torch.isfinite(ours), torch.isfinite(theirs)
    assert torch.equal(kept_ours, kept_theirs), "different tokens kept"
    eos = model.generation_config.eos_token_id
    for e in [eos] if isinstance(eos, int) else eos:  # min_new_tokens: no EOS at the first step
        assert not kept_ours[:, e].any(), f"EOS {e} kept before min_new_tokens"
    diff = (ours.softmax(-1) - theirs.softmax(-1)).abs().max().item()
    assert diff <= 1e-6, f"processed probabilities differ by {diff}"
    print(f"  {family} sampling (temperature, top-k, top-p, min-p, repetition penalty, min_new_tokens): the same "
          f"{int(kept_ours.sum())} tokens kept, probabilities within {diff:.1e}")


def greedy_requests(tmp):
    path = tmp / "greedy.jsonl"
    path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in TEXTS[:3])
                    + json.dumps({"messages": CHAT}) + "\n")
    return path


def ours_greedy(checkpoint, tmp, tag):
    out = tmp / f"{tag}.out.jsonl"
    run("generate", "--checkpoint", checkpoint, "--input", greedy_requests(tmp), "--greedy", "-n", 32,
        "--output", out)
    return [json.loads(line)["token_ids"] for line in out.read_text().splitlines()]


def theirs_greedy(model_dir, tok, prompts):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    batch, out = their_generation(model, tok, prompts, do_sample=False)
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    rows = []
    for row in out[:, batch["input_ids"].shape[1]:].tolist():
        if any(t in eos for t in row):
            row = row[:next(k for k, t in enumerate(row) if t in eos) + 1]
        rows.append(row)
    return rows


def lora_targets(src):
    """Every attention projection and MLP / expert matrix of the model in `src`: under latent
    attention (MLA) its low-rank query and key-value projections, so that a decode step's
    absorbed kv_b_proj carries an adapter; on Gated DeltaNet layers their input projections
    (Qwen3-Next fused, Qwen3.5 split) and out_proj, so that the recurrent decode steps do."""
    c = json.loads((src / "config.json").read_text())
    c = c.get("text_config", c)
    attention = ["q_proj", "k_proj", "v_proj"]
    if c.get("kv_lora_rank"):
        attention = (["q_a_proj", "q_b_proj"] if c.get("q_lora_rank") else ["q_proj"]) + \
            ["kv_a_proj_with_mqa", "kv_b_proj"]
    linear = []
    if "linear_attention" in (c.get("layer_types") or []):
        linear = (["in_proj_qkvz", "in_proj_ba"] if c.get("model_type") == "qwen3_next" else
                  ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"]) + ["out_proj"]
    return attention + linear + ["o_proj", "gate_proj", "up_proj", "down_proj"]


def check_trained(family, src, tok, tmp, prompts):
    """LoRA and LoRA over a 4-bit base, 6 steps each on text tokenized with the tiny tokenizer."""
    corpus = tmp / "corpus.txt"
    corpus.write_text("\n".join(TEXTS * 40))
    run("prepare-data", corpus, "--out", tmp / "data", "--tokenizer", "hf", "--tokenizer-file",
        tmp / "tok/tokenizer.json", "--valid-fraction", "0.1")
    base = ours_greedy(src, tmp, "base")
    for tag, extra in (("lora", {}), ("qlora", {"quantization": {
            "load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
            "bnb_4bit_compute_dtype": "float32"}})):
        out = tmp / f"run-{tag}"
        cfg = tmp / f"{tag}.json"
        cfg.write_text(json.dumps({
            "train_micro_batch_size_per_gpu": 4,
            "optimizer": {"type": "AdamW", "params": {"lr": 2e-2}},
            "lora": {"r": 4, "lora_alpha": 8, "target_modules": lora_targets(src)},
            "model": {"seq_len": 32, "init_from": str(src)},
            "data": {"path": str(tmp / "data")},
            "training": {"device": "cpu", "output_dir": str(out), "train_iters": 6, "eval_interval": 0},
            **extra}))
        run("--config", cfg, "-q")
        ckpt = out / "checkpoints" / "step-00000006"
        ours = ours_greedy(ckpt, tmp, tag)
        merged = tmp / f"merged-{tag}"
        run("export-hf", ckpt, "--merge", "--out", merged)
        theirs = theirs_greedy(merged, tok, prompts)
        assert ours == theirs, f"{family} {tag}: ours {ours} transformers (merged export) {theirs}"
        assert ours != base, f"{family} {tag}: the adapters changed nothing"
        print(f"  {family} {tag} checkpoint (adapters unmerged{', 4-bit nf4 base' if extra else ''}): "
              "32 greedy tokens x 4 requests token-identical to transformers on its merged export, "
              "and not the base model's")


def read_until(fd, marker, seen, timeout=300):
    """Terminal output until `marker` has appeared len(seen) + 1 times in all; returns the new text."""
    out = b""
    while (seen + out).count(marker) <= seen.count(marker):
        ready, _, _ = select.select([fd], [], [], timeout)
        assert ready, f"no {marker!r} from chat within {timeout} s: {(seen + out)[-300:]!r}"
        out += os.read(fd, 4096)
    return out


def check_chat(model, tok, src, tmp):
    transcript = tmp / "chat.jsonl"
    master, slave = pty.openpty()
    proc = subprocess.Popen([BIN, "chat", "--checkpoint", str(src), "--greedy", "-n", "12", "--system",
                             CHAT[0]["content"], "--transcript", str(transcript)],
                            stdin=slave, stdout=slave, stderr=subprocess.PIPE)
    os.close(slave)
    screen = read_until(master, b"> ", b"")
    for line in ("Why is the sky blue?", "And the sea?"):
        os.write(master, line.encode() + b"\n")
        screen += read_until(master, b"> ", screen)
    os.write(master, b"\x04")  # Ctrl-D
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    os.close(master)
    turns = [json.loads(t) for t in transcript.read_text().splitlines()]
    assert len(turns) == 2, turns
    messages = [CHAT[0]]
    for turn, user in zip(turns, ("Why is the sky blue?", "And the sea?")):
        messages.append({"role": "user", "content": user})
        expected = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert turn["prompt"] == expected, (turn["prompt"], expected)
        ids = tok(expected, add_special_tokens=False, return_tensors="pt")
        with torch.no_grad():
            theirs = model.generate(**ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
        theirs = theirs[0, ids["input_ids"].shape[1]:].tolist()
        assert turn["reply_ids"] == theirs[:len(turn["reply_ids"])], (turn["reply_ids"], theirs)
        assert turn["reply"].encode() in screen.replace(b"\r\n", b"\n"), (turn["reply"], screen)
        messages.append({"role": "assistant", "content": turn["reply"]})
    print("  chat through a pseudo-terminal: 2 turns rendered as apply_chat_template, replies as "
          "transformers' greedy generate, shown on the terminal; Ctrl-D exits 0")


def wait_exit(pid, timeout):
    """The child's wait status; a child still running after `timeout` s is killed and fails the check."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.1)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError(f"chat still running {timeout} s after Ctrl-C at the prompt")


def check_chat_interrupt(src):
    """Ctrl-C on the chat's controlling terminal: while a reply streams it ends that reply
    ("[stopped]", back at the prompt); at the prompt it ends the session with exit 0."""
    pid, fd = pty.fork()
    if pid == 0:
        # No EOS for 100,000 tokens: the reply is still streaming when the Ctrl-C comes, whichever
        # family's greedy reply would end early.
        os.execv(BIN, [BIN, "chat", "--checkpoint", str(src), "--greedy", "-n", "100000",
                       "--min-new-tokens", "100000"])
    try:
        screen = read_until(fd, b"> ", b"")
        os.write(fd, b"Why is the sky blue?\n")
        time.sleep(2)  # streaming (100,000 tokens would take minutes)
        os.write(fd, b"\x03")
        screen += read_until(fd, b"> ", screen)
        assert b"[stopped]" in screen, screen[-200:]
        os.write(fd, b"\x03")
        status = wait_exit(pid, 60)
    finally:
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, status
    print("  chat: Ctrl-C ends the streaming reply ([stopped], back at the prompt), then the session "
          "(exit 0)")


def check_bad_input(src, tmp):
    ckpt, bare = tmp / "imported", tmp / "no-tokenizer"
    run("import-hf", src, "--out", ckpt)
    run("import-hf", src, "--out", bare)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (bare / f).unlink()
    out = tmp / "never.jsonl"
    cases = {"no tokenizer": (["--checkpoint", bare, "--prompt", "hi"], "no tokenizer.json"),
             "too long": (["--checkpoint", ckpt, "--prompt", "word " * 5000], "context"),
             "bad line": (["--checkpoint", ckpt, "--input", tmp / "bad.jsonl"], "bad.jsonl line 2")}
    (tmp / "bad.jsonl").write_text('{"prompt": "fine"}\n{"prompt": 3}\n')
    for what, (args, expect) in cases.items():
        p = run("generate", *args, "--output", out, check=False)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and expect in lines[0], (what, p.returncode, p.stderr)
        assert not out.exists(), what
    print("  bad input: no tokenizer, a prompt past the context, a malformed line: exit 2, one line each, "
          "no output")


def main():
    families = sys.argv[2:] or list(ALL)
    with tempfile.TemporaryDirectory() as t:
        tmp = pathlib.Path(t)
        tokenizer_files(tmp / "tok")
        for family in families:
            model, tok, src, prompts = check_greedy(family, tmp, tmp / "tok")
            if family == families[0]:
                check_sampling(family, model, tok, src, tmp, prompts)
                check_chat(model, tok, src, tmp)
                check_chat_interrupt(src)
                check_trained(family, src, tok, tmp, prompts)
                check_bad_input(src, tmp)
        if "mixtral" in families:
            llama2_tokenizer_files(tmp / "tok-llama2")
            # its pieces are short: the chat takes ~100 tokens
            check_greedy("mixtral", tmp, tmp / "tok-llama2", tag="-llama2-tokenizer", max_position_embeddings=256)
    print("generate: OK")


if __name__ == "__main__":
    main()
