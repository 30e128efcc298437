"""prepare-data --tokenizer hf against Hugging Face's `tokenizers` (test-only oracle): two
byte-level BPE tokenizers trained here (GPT-2's split regex, and a Llama-3/Qwen-style split
regex), >= 2000 merges and two special tokens each; the ids prepare-data writes for >= 1 MB of
held-out text in several scripts (Latin, Cyrillic, CJK, emoji, digits, whitespace runs, special
tokens inside the text) equal tokenizers' encode(text, add_special_tokens=False).ids; the same
for a Llama-3 Split with ByteLevel(add_prefix_space) and for Llama-2/Mixtral-style files
(Prepend/Replace normalizers, no pre-tokenizer, byte_fallback or a fused <unk>) on text with
characters their training never saw, and on one document over the chunk size. Also
--tokenizer-from DIR, invalid UTF-8 and refused files.

usage: hf_tokenizer_test.py MOE_TRAIN_BINARY
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
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

BIN = sys.argv[1]
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = ["<|endoftext|>", "<|pad|>"]


def corpus(seed, size):
    rnd = random.Random(seed)
    latin = "the of and to in is that it for was on are as with his they at be this from".split()
    cyr = "и в не на что он с как это по но они мы вы так же было уже ещё".split()
    cjk = ["中文", "日本語", "テキスト", "한국어", "数据", "模型", "训练", "の", "は"]
    emoji = ["😀", "🚀", "👍🏽", "🇫🇷", "❤️", "✨"]
    out, n = [], 0
    while n < size:
        kind = rnd.random()
        if kind < 0.35:
            w = rnd.choice(latin).capitalize() if rnd.random() < 0.2 else rnd.choice(latin)
        elif kind < 0.55:
            w = rnd.choice(cyr)
        elif kind < 0.7:
            w = "".join(rnd.choice(cjk) for _ in range(rnd.randint(1, 3)))
        elif kind < 0.78:
            w = rnd.choice(emoji)
        elif kind < 0.88:
            w = str(rnd.randint(0, 10 ** rnd.randint(1, 7)))
        elif kind < 0.93:
            w = rnd.choice(["can't", "I'll", "we've", "you'RE", "it's", "l'été"])
        elif kind < 0.97:
            w = rnd.choice(["!", "?!", "...", "—", "(x)", "#", "$5.00", "a\tb", "«q»"])
        else:
            w = rnd.choice(SPECIAL)
        sep = rnd.choice([" "] * 12 + ["  ", "\n", "\n\n", "   \n", "\t", " \n "])
        out.append(w + sep)
        n += len(w) + len(sep)
    return "".join(out)


def train_ids(out):
    """Every id of a prepare-data output's training split, in order."""
    m = json.loads((out / "manifest.json").read_text())
    parts = []
    for sh in m["splits"]["train"]:
        with h5py.File(out / sh["file"], "r") as f:
            parts.append(np.asarray(f["tokens"][:], dtype=np.int64))
    return np.concatenate(parts)


def trained(kind, train_text, path):
    tok = Tokenizer(models.BPE())
    if kind == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2600, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([train_text[i:i + 4096] for i in range(0, len(train_text), 4096)], trainer)
    tok.save(str(path))
    merges = len(json.loads(path.read_text())["model"]["merges"])
    assert merges >= 2000, merges
    return tok, merges


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    train_text = corpus(1, 600_000)
    held_out = corpus(2, 1_100_000)
    (tmp / "held_out.txt").write_text(held_out)
    for kind in ("gpt2", "llama3", "llama3-ignore-merges", "llama3-prefix-space"):
        if kind in ("llama3-ignore-merges", "llama3-prefix-space"):
            j = json.loads((tmp / "llama3.json").read_text())
            if kind == "llama3-ignore-merges":  # Llama-3's tokenizer.json sets it
                j["model"]["ignore_merges"] = True
            else:  # ByteLevel after a Split prepends its space to every piece, not once
                j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = True
            (tmp / f"{kind}.json").write_text(json.dumps(j))
            tok = Tokenizer.from_file(str(tmp / f"{kind}.json"))
        else:
            tok, merges = trained(kind, train_text, tmp / f"{kind}.json")
        want = np.array(tok.encode(held_out, add_special_tokens=False).ids, dtype=np.int64)
        out = tmp / f"ds-{kind}"
        t0 = time.perf_counter()
        r = subprocess.run([BIN, "prepare-data", tmp / "held_out.txt", "--out", out, "--tokenizer", "hf",
                            "--tokenizer-file", tmp / f"{kind}.json", "--threads", "1"],
                           capture_output=True, text=True)
        secs = time.perf_counter() - t0
        assert r.returncode == 0, r.stderr
        got = train_ids(out)
        if len(got) != len(want) or not np.array_equal(got, want):
            n = min(len(got), len(want))
            first = int(np.argmax(got[:n] != want[:n])) if np.any(got[:n] != want[:n]) else n
            raise SystemExit(f"FAIL {kind}: {len(got)} vs {len(want)} ids, first difference at {first}: "
                             f"ours {got[first:first + 8]} tokenizers {want[first:first + 8]}")
        t1 = time.perf_counter()
        tok.encode(held_out, add_special_tokens=False)
        ref_s = time.perf_counter() - t1
        print(f"{kind}: {merges} merges, {len(SPECIAL)} special tokens: {len(want)} ids on "
              f"{len(held_out.encode()) / 1e6:.2f} MB identical to tokenizers "
              f"(prepare-data {secs:.2f} s for the whole command; tokenizers.encode {ref_s:.2f} s)")
    # Llama-2 / Mixtral's SentencePiece-converted BPE: normalizer Sequence[Prepend("▁"),
    # Replace(" ", "▁")], no pre-tokenizer (a segment is one piece), byte_fallback with the 256
    # <0xXX> tokens in the vocabulary, unk_token "<unk>" with fuse_unk; and the same without
    # byte_fallback, where unseen characters become one fused <unk>. The held-out text adds
    # characters the training text never had (Greek, Devanagari, emoji, a combining accent).
    unseen = corpus(6, 200_000)
    rnd = random.Random(6)
    unseen = "".join(c + (rnd.choice(["Ω", "अ", "🦀", "e\u0301", "ЖЖ", "🦀🦀"]) if rnd.random() < 0.01 else "")
                     for c in unseen)
    (tmp / "unseen.txt").write_text(held_out[:300_000] + unseen)
    for kind, fallback in (("llama2", True), ("llama2-unk", False)):
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=fallback, fuse_unk=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        trainer = trainers.BpeTrainer(vocab_size=2600, special_tokens=["<unk>", "<s>", "</s>"],
                                      show_progress=False)
        tok.train_from_iterator([train_text[i:i + 512] for i in range(0, 300_000, 512)], trainer)
        j = json.loads(tok.to_str())
        assert j["pre_tokenizer"] is None and j["model"]["byte_fallback"] == fallback
        if fallback:
            vocab = j["model"]["vocab"]
            for b in range(256):
                vocab.setdefault(f"<0x{b:02X}>", len(vocab))
        (tmp / f"{kind}.json").write_text(json.dumps(j))
        tok = Tokenizer.from_file(str(tmp / f"{kind}.json"))
        text = (tmp / "unseen.txt").read_text()
        want = np.array(tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)
        out = tmp / f"ds-{kind}"
        r = subprocess.run([BIN, "prepare-data", tmp / "unseen.txt", "--out", out, "--tokenizer", "hf",
                            "--tokenizer-file", tmp / f"{kind}.json", "--threads", "2"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        got = train_ids(out)
        special = {"<unk>": tok.token_to_id("<unk>"), "<0xF0>": tok.token_to_id("<0xF0>")}
        used = {k: int((want == v).sum()) for k, v in special.items() if v is not None}
        assert np.array_equal(got, want), (kind, len(got), len(want),
                                           int(np.argmax(got[:min(len(got), len(want))] != want[:min(len(got), len(want))])))
        assert (used.get("<0xF0>", 0) > 0) if fallback else (used["<unk>"] > 0), used
        print(f"{kind}: {len(want)} ids on {len(text.encode()) / 1e6:.2f} MB identical to tokenizers "
              f"(as one piece; byte-fallback/unk ids used: {used})")
    # Without a pre-tokenizer a merge may span any cut, and Prepend would add "▁" at one: a
    # document over the 8 MiB chunk size is tokenized whole, whatever the threads.
    long_text = (tmp / "unseen.txt").read_text() * 12
    (tmp / "long.txt").write_text(long_text)
    tok = Tokenizer.from_file(str(tmp / "llama2.json"))
    want = np.array(tok.encode(long_text, add_special_tokens=False).ids, dtype=np.int64)
    r = subprocess.run([BIN, "prepare-data", tmp / "long.txt", "--out", tmp / "ds-long-llama2",
                        "--tokenizer", "hf", "--tokenizer-file", tmp / "llama2.json", "--threads", "2"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert np.array_equal(train_ids(tmp / "ds-long-llama2"), want)
    print(f"llama2 on {len(long_text.encode()) / 1e6:.1f} MB as one document on 2 threads: "
          f"{len(want)} ids identical (never cut)")
    # A file of several chunks, tokenized on 2 threads: the chunk cuts change nothing (one 9 MB
    # document per family: hf_tokenizer_families_test.py). This one has white space around every newline (a trailing space, CRLF, indentation, U+3000), where
    # GPT-2's \s+(?!\S) would glue differently at a chunk's end than inside the text.
    rnd = random.Random(5)
    spaced = "".join(line + rnd.choice([" \n", "\r\n", "\n  ", "\u3000\n", "\n\u3000", "\n"])
                     for line in corpus(4, 10_000_000).split("\n"))
    (tmp / "spaced.txt").write_bytes(spaced.encode())
    for name, text, kinds in (("spaced", spaced, ("gpt2", "llama3")),):
        for kind in kinds:
            tok = Tokenizer.from_file(str(tmp / f"{kind}.json"))
            want = np.array(tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)
            out = tmp / f"ds-{name}-{kind}"
            r = subprocess.run([BIN, "prepare-data", tmp / f"{name}.txt", "--out", out, "--tokenizer", "hf",
                                "--tokenizer-file", tmp / f"{kind}.json", "--threads", "2"],
                               capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            got = train_ids(out)
            assert np.array_equal(got, want), (name, kind, len(got), len(want))
            print(f"{kind} on {name} text, {len(text.encode()) / 1e6:.1f} MB in 8 MiB chunks on 2 threads: "
                  f"{len(want)} ids identical")
    # Invalid UTF-8: exit 2 naming the file and the byte offset, nothing written.
    bad = tmp / "bad.txt"
    bad.write_bytes(("ok text\n" * 1000).encode() + b"\xff 1234567890\n")
    r = subprocess.run([BIN, "prepare-data", bad, "--out", tmp / "bad-out", "--tokenizer", "hf",
                        "--tokenizer-file", tmp / "gpt2.json"], capture_output=True, text=True)
    assert r.returncode == 2 and f"{bad}: invalid UTF-8 at byte offset 8000" in r.stderr, r.stderr
    assert not (tmp / "bad-out").exists()
    print(f"invalid UTF-8: {r.stderr.strip()[:140]}")
    # --tokenizer-from DIR: a model directory's tokenizer.json, the same ids as --tokenizer-file.
    model_dir = tmp / "model-dir"
    model_dir.mkdir()
    (model_dir / "tokenizer.json").write_text((tmp / "llama3.json").read_text())
    r = subprocess.run([BIN, "prepare-data", tmp / "held_out.txt", "--out", tmp / "from-dir",
                        "--tokenizer-from", model_dir], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert np.array_equal(train_ids(tmp / "from-dir"), train_ids(tmp / "ds-llama3"))
    r = subprocess.run([BIN, "prepare-data", tmp / "held_out.txt", "--out", tmp / "from-empty",
                        "--tokenizer-from", tmp / "data-none"], capture_output=True, text=True)
    assert r.returncode == 2 and "not a directory" in r.stderr, r.stderr
    (tmp / "empty-dir").mkdir()
    r = subprocess.run([BIN, "prepare-data", tmp / "held_out.txt", "--out", tmp / "from-empty",
                        "--tokenizer-from", tmp / "empty-dir"], capture_output=True, text=True)
    assert r.returncode == 2 and "no tokenizer.json or tokenizer.model" in r.stderr, r.stderr
    assert not (tmp / "from-empty").exists()
    print(f"--tokenizer-from: the directory's tokenizer.json; refused: {r.stderr.strip()[:120]}")
    # Unsupported files are refused by name.
    j = json.loads((tmp / "gpt2.json").read_text())
    j["normalizer"] = {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": True}
    (tmp / "bert.json").write_text(json.dumps(j))
    r = subprocess.run([BIN, "prepare-data", tmp / "held_out.txt", "--out", tmp / "bert-out", "--tokenizer", "hf",
                        "--tokenizer-file", tmp / "bert.json"], capture_output=True, text=True)
    assert r.returncode == 2 and "normalizer BertNormalizer" in r.stderr and not (tmp / "bert-out").exists(), r.stderr
    print(f"unsupported: {r.stderr.strip()[:140]}")
print("ok")
