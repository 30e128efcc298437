"""prepare-data --tokenizer hf against Hugging Face's `tokenizers` (test-only oracle) for every
family moe-train imports: tokenizer.json files built here with `tokenizers`, each copying a real
family's pipeline (normalizer, pre-tokenizer, BPE flags, added tokens, post-processor; the real
files' settings are noted next to each), trained on this file's text. For each, the ids
prepare-data writes equal Tokenizer.encode(text, add_special_tokens=False) on held-out
multilingual text (combining sequences where NFC/NFKC change the text, CJK, Arabic, emoji, runs of
white space, CRLF, special-token strings inside the text) and on one 9 MB document cut into 8 MiB
chunks on 2 threads; with --add-special-tokens they equal add_special_tokens=True. Also the
normalizers, pre-tokenizers and BPE flags the families do not use themselves (Lowercase, Strip,
NFD/NFKD, Digits, Punctuation, WhitespaceSplit, Metaspace with split, every Split behavior,
continuing_subword_prefix, end_of_word_suffix), and --invalid-utf8 replace against Python's
bytes.decode(errors="replace").

usage: hf_tokenizer_families_test.py MOE_TRAIN_BINARY
"""
import json
import pathlib
import random
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np
from tokenizers import (AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers,
                        processors, trainers)

BIN = sys.argv[1]
# Qwen2 / Qwen3 (Qwen/Qwen3-30B-A3B tokenizer.json): NFC; Split(this, Isolated) then
# ByteLevel(add_prefix_space=false, use_regex=false); digits one at a time.
QWEN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Llama-3 (meta-llama/Meta-Llama-3-8B): the same with digits in threes, no normalizer.
LLAMA3 = QWEN.replace(r"|\p{N}|", r"|\p{N}{1,3}|")
# DeepSeek-V3 (deepseek-ai/DeepSeek-V3): three Isolated Splits then ByteLevel(use_regex=false).
DEEPSEEK = [r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
            r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
            r"""| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""]
BOS, EOS = "<s>", "</s>"


def corpus(seed, size):
    rnd = random.Random(seed)
    words = {
        "latin": "the of and to in is that it for was on are as with his they at be this from".split(),
        "cyrillic": "и в не на что он с как это по но они мы вы так же было уже ещё".split(),
        "cjk": ["中文", "日本語", "テキスト", "한국어", "数据", "模型", "训练", "の", "は", "漢字かなカナ", "ｶﾀｶﾅ"],
        "arabic": ["مرحبا", "بالعالم", "مَرْحَبًا", "العربية", "٣٤٥", "كتاب"],
        # Combining sequences: decomposed accents (NFC composes them), marks in either order
        # (canonical reordering), Hangul jamo, a composition exclusion (क़), compatibility
        # characters (NFKC/NFKD change them, NFC does not), the Angstrom and Ohm signs (NFC
        # changes them), a Unicode 12.1 character and a Unicode 14 mark (outside the tables of
        # `tokenizers`: left alone).
        "combining": ["e\u0301t\u00e9", "a\u0308", "A\u030a", "\u212b", "e\u0323\u0302", "e\u0302\u0323",
                      "\u1100\u1161\u11a8", "\u0915\u093c", "\ufb01le", "\uff21\uff22\uff23\uff11", "x\u00b2",
                      "\uf900", "\u2126", "\u01c5", "\u0130stanbul", "\u03a3\u0391\u03a3", "stra\u00dfe",
                      "Ti\u1ebfng Vi\u1ec7t", "Tie\u0302\u0301ng", "\u32ff", "a\u0301\u1ac1\u0323", "\u00bd"],
        "emoji": ["😀", "🚀", "👍🏽", "🇫🇷", "❤️", "✨", "👨\u200d👩\u200d👧"],
        "punct": ["!", "?!", "...", "—", "(x)", "#", "$5.00", "«q»", "C++", "e-mail", "…", "can't",
                  "I'll", "we've", "you'RE", "l'été"],
        "special": ["<|endoftext|>", "<|im_start|>", BOS, EOS, "<\uff5cend\u2581of\u2581sentence\uff5c>",
                    "[gMASK]<sop>", "<|user|>", "<think>x</think>", "/nothink"],
    }
    kinds = ["latin"] * 30 + ["cyrillic"] * 10 + ["cjk"] * 12 + ["arabic"] * 8 + ["combining"] * 14 + \
            ["emoji"] * 6 + ["punct"] * 8 + ["digits"] * 8 + ["special"] * 2
    seps = [" "] * 14 + ["  ", "    ", " " * 13, "\n", "\n\n", "\r\n", "   \n", "\t", " \n ", "\u00a0",
                         "\u3000", "\u2003", "\t\t "]
    out, n = [], 0
    while n < size:
        kind = rnd.choice(kinds)
        w = str(rnd.randint(0, 10 ** rnd.randint(1, 9))) if kind == "digits" else rnd.choice(words[kind])
        if kind == "latin" and rnd.random() < 0.2:
            w = w.capitalize()
        sep = rnd.choice(seps)
        out.append(w + sep)
        n += len(w) + len(sep)
    return "".join(out)


def split(rx, behavior="isolated", invert=False):
    return pre_tokenizers.Split(Regex(rx), behavior=behavior, invert=invert)


def byte_level(prefix=False, regex=False):
    return pre_tokenizers.ByteLevel(add_prefix_space=prefix, use_regex=regex)


def bos(token):
    return lambda ids: processors.TemplateProcessing(single=f"{token} $A", special_tokens=[(token, ids[token])])


# name: (normalizer, pre-tokenizer, BPE model arguments, special tokens, non-special added tokens
# (content, normalized), post-processor from the token ids, trainer arguments)
FAMILIES = {
    # GPT-2: ByteLevel(add_prefix_space=false) with its own regex; no normalizer.
    "gpt2": (None, byte_level(regex=True), {}, ["<|endoftext|>"], [], None, {}),
    # Llama-3: see LLAMA3; ignore_merges; post-processor ByteLevel then BOS.
    "llama3": (None, pre_tokenizers.Sequence([split(LLAMA3), byte_level()]), {"ignore_merges": True},
               ["<|begin_of_text|>", "<|end_of_text|>"], [],
               lambda ids: processors.Sequence([processors.ByteLevel(trim_offsets=False),
                                                bos("<|begin_of_text|>")(ids)]), {}),
    # Qwen2 / Qwen3: see QWEN; <think> and <tool_call> are added but not special.
    "qwen3": (normalizers.NFC(), pre_tokenizers.Sequence([split(QWEN), byte_level()]), {},
              ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], [("<think>", False), ("</think>", False)],
              lambda ids: processors.ByteLevel(trim_offsets=False), {}),
    # OLMoE (allenai/OLMoE-1B-7B-0924, GPT-NeoX's tokenizer): NFC, ByteLevel with its regex, and
    # added tokens for runs of 2..24 spaces that are normalized and not special.
    "olmoe": (normalizers.NFC(), byte_level(regex=True), {}, ["<|endoftext|>", "<|padding|>"],
              [(" " * n, True) for n in range(2, 25)], None, {}),
    # DeepSeek-V3: an empty normalizer Sequence, see DEEPSEEK; BOS by the post-processor.
    "deepseek-v3": (normalizers.Sequence([]),
                    pre_tokenizers.Sequence([split(r) for r in DEEPSEEK] + [byte_level()]), {},
                    ["<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>"],
                    [], bos("<\uff5cbegin\u2581of\u2581sentence\uff5c>"), {}),
    # GLM-4.5 / GLM-4.5-Air (zai-org, GLM-4's tokenizer.json with GLM-4.5's added tokens): no
    # normalizer, Split(GLM-4's regex = LLAMA3) then ByteLevel(use_regex=false); the role and
    # [gMASK]/<sop> markers special, the reasoning and tool-call tags added but not special (the
    # chat template writes [gMASK]<sop>; tests/chat/glm4_chat_test.py renders it).
    "glm4": (None, pre_tokenizers.Sequence([split(LLAMA3), byte_level()]), {},
             ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
              "<|assistant|>", "<|observation|>"],
             [(t, False) for t in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>",
                                   "</arg_key>", "<arg_value>", "</arg_value>", "/nothink")], None, {}),
    # Llama-2 / Mixtral-8x7B: Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer, byte_fallback,
    # unk_token <unk> with fuse_unk; BOS.
    "mixtral": (normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]),
                None, {"unk_token": "<unk>", "byte_fallback": True, "fuse_unk": True},
                ["<unk>", BOS, EOS], [], bos(BOS), {}),
    # Mistral-7B-v0.3 style: Metaspace(prepend_scheme=first, split=false) instead of the
    # normalizers.
    "mistral-metaspace": (None, pre_tokenizers.Metaspace(prepend_scheme="first", split=False),
                          {"unk_token": "<unk>", "byte_fallback": True, "fuse_unk": True},
                          ["<unk>", BOS, EOS], [], bos(BOS), {}),
    # No family's, but in the supported set: NFKD + Lowercase + Strip, WhitespaceSplit,
    # Punctuation, individual Digits, a subword prefix and a word suffix.
    "nfkd-wordpiece-like": (normalizers.Sequence([normalizers.NFKD(), normalizers.Lowercase(), normalizers.Strip()]),
                            pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(),
                                                     pre_tokenizers.Digits(individual_digits=True)]),
                            {"unk_token": "<unk>", "continuing_subword_prefix": "##", "end_of_word_suffix": "</w>"},
                            ["<unk>"], [], None,
                            {"continuing_subword_prefix": "##", "end_of_word_suffix": "</w>"}),
    # NFD, NFKC, Metaspace with split=true and prepend_scheme=always, the other Split behaviors
    # and contiguous Digits.
    "behaviors": (normalizers.Sequence([normalizers.NFD(), normalizers.NFKC()]),
                  pre_tokenizers.Sequence([
                      split(r"\p{P}", "merged_with_previous"), split(r"[\r\n]+", "merged_with_next"),
                      split(r"\p{Sc}", "contiguous"), split(r"\t", "removed"),
                      split(r"[^\p{Han}]+", "isolated", invert=True),
                      pre_tokenizers.Punctuation(behavior="contiguous"), pre_tokenizers.Digits(individual_digits=False),
                      pre_tokenizers.Metaspace(prepend_scheme="always", split=True)]),
                  {"unk_token": "<unk>", "byte_fallback": True}, ["<unk>"], [], None, {}),
}


def build(name, train_text, path):
    norm, pre, model_args, special, added, post, trainer_args = FAMILIES[name]
    tok = Tokenizer(models.BPE(**model_args))
    if norm is not None:
        tok.normalizer = norm
    if pre is not None:
        tok.pre_tokenizer = pre
    byte_level_family = pre is not None and "ByteLevel" in json.dumps(json.loads(tok.to_str())["pre_tokenizer"])
    extra = {"initial_alphabet": pre_tokenizers.ByteLevel.alphabet()} if byte_level_family else {}
    trainer = trainers.BpeTrainer(special_tokens=special, show_progress=False,
                                  **{"vocab_size": 3000, **extra, **trainer_args})
    tok.train_from_iterator([train_text[i:i + 2048] for i in range(0, len(train_text), 2048)], trainer)
    if added:
        tok.add_tokens([AddedToken(c, normalized=nz, special=False) for c, nz in added])
    if post is not None:
        tok.post_processor = post({t: tok.token_to_id(t) for t in special})
    j = json.loads(tok.to_str())
    if model_args.get("byte_fallback"):  # SentencePiece's 256 byte tokens, as the real files
        vocab = j["model"]["vocab"]
        for b in range(256):
            vocab.setdefault(f"<0x{b:02X}>", len(vocab) + len(j["added_tokens"]))
    path.write_text(json.dumps(j, ensure_ascii=False))
    tok = Tokenizer.from_file(str(path))
    # Hundreds at least (word-split families run out of pairs once every training word is a token).
    assert len(j["model"]["merges"]) >= 200, (name, len(j["model"]["merges"]))
    return tok, len(j["model"]["merges"])


def ids_of(out):
    """Every id of a prepare-data output's training split, in order."""
    m = json.loads((out / "manifest.json").read_text())
    parts = []
    for sh in m["splits"]["train"]:
        with h5py.File(out / sh["file"], "r") as f:
            parts.append(np.asarray(f["tokens"][:], dtype=np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64), m


def prepare(tmp, name, text_file, tag, *extra):
    out = tmp / f"ds-{name}-{tag}"
    t0 = time.perf_counter()
    r = subprocess.run([BIN, "prepare-data", text_file, "--out", out, "--tokenizer", "hf", "--tokenizer-file",
                        tmp / f"{name}.json", "--threads", "2", *map(str, extra)], capture_output=True, text=True)
    secs = time.perf_counter() - t0
    assert r.returncode == 0, (name, tag, r.stderr)
    return ids_of(out), secs


def same(name, tag, got, want):
    if len(got) == len(want) and np.array_equal(got, want):
        return
    n = min(len(got), len(want))
    first = int(np.argmax(got[:n] != want[:n])) if np.any(got[:n] != want[:n]) else n
    raise SystemExit(f"FAIL {name} {tag}: {len(got)} vs {len(want)} ids, first difference at {first}: "
                     f"ours {got[first:first + 8]} tokenizers {want[first:first + 8]}")


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    train_text = corpus(1, 500_000)
    held_out = corpus(2, 400_000)
    (tmp / "held_out.txt").write_text(held_out)
    big = corpus(3, 6_300_000)  # > 8 MiB: two chunks, cut where the family allows
    (tmp / "big.txt").write_text(big)
    assert len(big.encode()) > 8 << 20
    only = sys.argv[2:]  # optional: family names to run
    for name in FAMILIES:
        if only and name not in only:
            continue
        tok, merges = build(name, train_text, tmp / f"{name}.json")
        want = np.array(tok.encode(held_out, add_special_tokens=False).ids, dtype=np.int64)
        (got, _), secs = prepare(tmp, name, tmp / "held_out.txt", "held-out")
        same(name, "held-out", got, want)
        changed = held_out != (tok.normalizer.normalize_str(held_out) if tok.normalizer else held_out)
        with_special = np.array(tok.encode(held_out, add_special_tokens=True).ids, dtype=np.int64)
        (got_special, _), _ = prepare(tmp, name, tmp / "held_out.txt", "special", "--add-special-tokens")
        same(name, "--add-special-tokens", got_special, with_special)
        t0 = time.perf_counter()
        want_big = np.array(tok.encode(big, add_special_tokens=False).ids, dtype=np.int64)
        ref_s = time.perf_counter() - t0
        (got_big, _), big_s = prepare(tmp, name, tmp / "big.txt", "big")
        same(name, "9 MB document", got_big, want_big)
        print(f"{name}: {merges} merges; held-out {len(held_out.encode()) / 1e6:.2f} MB: {len(want)} ids identical "
              f"(normalizer changes the text: {changed}); --add-special-tokens: {len(with_special) - len(want)} "
              f"more, identical; one {len(big.encode()) / 1e6:.1f} MB document on 2 threads: {len(want_big)} ids "
              f"identical (prepare-data {big_s:.1f} s whole command, tokenizers.encode {ref_s:.1f} s)")
    if only:
        sys.exit(0)
    # --add-special-tokens with --append-eod: a template that already ends with the
    # end-of-document token keeps one.
    j = json.loads((tmp / "mixtral.json").read_text())
    ids = {t: j["model"]["vocab"][t] for t in (BOS, EOS)}
    tok = Tokenizer.from_file(str(tmp / "mixtral.json"))
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A {EOS}", special_tokens=list(ids.items()))
    j["post_processor"] = json.loads(tok.to_str())["post_processor"]
    (tmp / "mixtral-eos.json").write_text(json.dumps(j, ensure_ascii=False))
    tok = Tokenizer.from_file(str(tmp / "mixtral-eos.json"))
    docs = ["first document", "second one, with ünïcödé", "third"]
    (tmp / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    want = np.concatenate([tok.encode(t, add_special_tokens=True).ids for t in docs])
    (got, m), _ = prepare(tmp, "mixtral-eos", tmp / "docs.jsonl", "eod", "--add-special-tokens", "--append-eod")
    assert m["eod_id"] == ids[EOS] and np.array_equal(got, want), (got, want)
    print(f"--add-special-tokens --append-eod with a <s> $A </s> template: {len(want)} ids, one </s> per document")
    # --invalid-utf8 replace: U+FFFD exactly where Python's errors="replace" puts them (maximal
    # subparts: a truncated sequence is one, a bad lead byte, surrogate or overlong form one per
    # byte), counted in manifest.json; without it, exit 2 naming the file and offset.
    bad = (b"ok \xff tail\n" b"cut \xe2\x82 short\n" b"surrogate \xed\xa0\x80 x\n" b"overlong \xc0\xaf\n"
           b"four \xf0\x9f\x98 and \xf4\x90\x80\x80 end\n" b"fine \xe2\x82\xac euro\n" b"trailing \xe2")
    (tmp / "bad.txt").write_bytes(bad)
    (tmp / "bad.jsonl").write_bytes(b'{"text": "json \xff\xfe line"}\n{"text": "good"}\n')
    tok = Tokenizer.from_file(str(tmp / "qwen3.json"))
    decoded = bad.decode("utf-8", errors="replace")
    (got, m), _ = prepare(tmp, "qwen3", tmp / "bad.txt", "replace", "--invalid-utf8", "replace")
    same("qwen3", "--invalid-utf8 replace", got, np.array(tok.encode(decoded, add_special_tokens=False).ids))
    assert m["invalid_utf8_replaced"] == decoded.count("\ufffd"), (m, decoded.count("\ufffd"))
    (got, m), _ = prepare(tmp, "qwen3", tmp / "bad.jsonl", "replace-jsonl", "--invalid-utf8", "replace")
    want = [tok.encode(json.loads(line)["text"], add_special_tokens=False).ids
            for line in (tmp / "bad.jsonl").read_bytes().decode("utf-8", errors="replace").splitlines()]
    assert np.array_equal(got, np.concatenate(want)) and m["invalid_utf8_replaced"] == 2, (got, want, m)
    r = subprocess.run([BIN, "prepare-data", tmp / "bad.txt", "--out", tmp / "bad-out", "--tokenizer", "hf",
                        "--tokenizer-file", tmp / "qwen3.json"], capture_output=True, text=True)
    assert r.returncode == 2 and f"{tmp / 'bad.txt'}: invalid UTF-8 at byte offset 3" in r.stderr, r.stderr
    assert not (tmp / "bad-out").exists()
    print(f"--invalid-utf8 replace: {decoded.count(chr(0xfffd))} U+FFFD as Python's errors=\"replace\", "
          f"ids identical; default: {r.stderr.strip()[:110]}")
    # Refused by name: a post-processor --add-special-tokens does not understand, a normalizer
    # and a pre-tokenizer outside the supported set.
    for what, edit, args in (
            ("post_processor BertLikeUnknown", lambda j: j.update(post_processor={"type": "BertLikeUnknown"}),
             ["--add-special-tokens"]),
            ("normalizer Precompiled", lambda j: j.update(normalizer={"type": "Precompiled", "precompiled_charsmap": None}), []),
            ("pre_tokenizer UnicodeScripts", lambda j: j.update(pre_tokenizer={"type": "UnicodeScripts"}), [])):
        j = json.loads((tmp / "gpt2.json").read_text())
        edit(j)
        (tmp / "refused.json").write_text(json.dumps(j))
        r = subprocess.run([BIN, "prepare-data", tmp / "held_out.txt", "--out", tmp / "refused-out", "--tokenizer",
                            "hf", "--tokenizer-file", tmp / "refused.json", *args], capture_output=True, text=True)
        assert r.returncode == 2 and what in r.stderr and not (tmp / "refused-out").exists(), (what, r.stderr)
        print(f"refused: {r.stderr.strip()[:150]}")
print("ok")
