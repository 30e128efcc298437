#!/usr/bin/env python3
"""prepare-data --tokenizer hf against `tokenizers`' encode_batch on the same corpus and threads.

Builds a BPE tokenizer.json locally (byte-level with GPT-2's pre-tokenizer, or Llama-3's split
regex with --llama3; or Llama-2/Mixtral-style with --llama2: Prepend/Replace normalizers, no
pre-tokenizer, byte fallback; or Qwen2/Qwen3-style with --qwen3: NFC, Qwen's split regex; trained with `tokenizers` on a sample of the corpus, nothing downloaded), writes a
JSONL corpus of multi-script documents (default ~40 MB as ~900 documents of 1-90 kB), then times
  - moe-train prepare-data --tokenizer hf --jsonl --threads T (wall clock of the whole command:
    reading, tokenizing, HDF5 shards and their SHA-256 manifest), and
  - a Python process that reads and json-parses the same file and calls
    Tokenizer.encode_batch(texts, add_special_tokens=False) with RAYON_NUM_THREADS=T
    (tokenizing only; its start-up and the file read are excluded),
and checks that both give the same ids. Prints MB/s for each (MB = 10^6 bytes of JSONL text).

Then times one document of S MB against one of 4S MB (--scaling-mb S, default 2): linear time
means a ratio near 4.

usage: tokenizer_throughput.py MOE_TRAIN [--mb 40] [--docs 900] [--threads 2]
                               [--llama3 | --llama2 | --qwen3] [--scaling-mb 2]
"""
import argparse
import json
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")

WORDS = ("the of and to in is that it for was on are as with his they at be this from "
         "и в не на что он с как это по но они мы вы так же было уже ещё "
         "中文 日本語 テキスト 한국어 数据 模型 训练 の は "
         "😀 🚀 👍🏽 ❤️ ✨ can't I'll we've it's l'été naïve café 2026 3.14 $5.00 — « » "
         "cafe\u0301 Tie\u0302\u0301ng \u1100\u1161 مَرْحَبًا").split()


def document(rnd, size):
    out, n = [], 0
    while n < size:
        w = rnd.choice(WORDS) if rnd.random() < 0.9 else str(rnd.randint(0, 10 ** 6))
        sep = rnd.choice([" "] * 14 + ["  ", "\n", "\n\n", "\t", ". "])
        out.append(w + sep)
        n += len(w.encode()) + len(sep)
    return "".join(out)


ENCODE_BATCH = r"""
import json, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
texts = [json.loads(l)["text"] for l in open(sys.argv[2], encoding="utf-8")]
t = time.perf_counter()
enc = tok.encode_batch(texts, add_special_tokens=False)
dt = time.perf_counter() - t
ids = [i for e in enc for i in e.ids]
import numpy as np
np.save(sys.argv[3], np.asarray(ids, dtype=np.int64))
print(dt)
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("moe_train")
    ap.add_argument("--mb", type=float, default=40)
    ap.add_argument("--docs", type=int, default=900)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama3", action="store_true")
    ap.add_argument("--llama2", action="store_true", help="Llama-2/Mixtral-style file")
    ap.add_argument("--qwen3", action="store_true", help="Qwen2/Qwen3-style file (NFC)")
    ap.add_argument("--scaling-mb", type=float, default=2.0)
    a = ap.parse_args()
    rnd = random.Random(7)
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        target = int(a.mb * 1e6)
        sizes = [rnd.randint(1000, 2 * target // a.docs - 1000) for _ in range(a.docs)]
        corpus = tmp / "corpus.jsonl"
        with corpus.open("w", encoding="utf-8") as f:
            for s in sizes:
                f.write(json.dumps({"text": document(rnd, s)}, ensure_ascii=False) + "\n")
        mb = corpus.stat().st_size / 1e6

        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True)
                        if a.llama2 else models.BPE())
        if a.llama2:  # SentencePiece-converted: Prepend/Replace, no pre-tokenizer
            tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                                   normalizers.Replace(" ", "▁")])
        elif a.llama3 or a.qwen3:
            if a.qwen3:
                tok.normalizer = normalizers.NFC()
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(QWEN if a.qwen3 else LLAMA3), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        else:
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if a.llama2:
            trainer = trainers.BpeTrainer(vocab_size=8000, special_tokens=["<unk>", "<s>", "</s>"],
                                          show_progress=False)
            tok.train_from_iterator([document(random.Random(i), 512) for i in range(4000)], trainer)
            j = json.loads(tok.to_str())
            for b in range(256):  # Llama-2 keeps the 256 byte tokens in its vocabulary
                j["model"]["vocab"].setdefault(f"<0x{b:02X}>", len(j["model"]["vocab"]))
            (tmp / "tokenizer.json").write_text(json.dumps(j))
        else:
            tok.decoder = decoders.ByteLevel()
            trainer = trainers.BpeTrainer(vocab_size=8000, special_tokens=["<|endoftext|>"],
                                          show_progress=False,
                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
            tok.train_from_iterator([document(random.Random(i), 4096) for i in range(500)], trainer)
            tok.save(str(tmp / "tokenizer.json"))

        out = tmp / "shards"
        t = time.perf_counter()
        r = subprocess.run([a.moe_train, "-q", "prepare-data", str(corpus), "--out", str(out),
                            "--tokenizer", "hf", "--tokenizer-file", str(tmp / "tokenizer.json"),
                            "--jsonl", "--threads", str(a.threads)],
                           capture_output=True, text=True)
        ours = time.perf_counter() - t
        if r.returncode != 0:
            sys.exit(f"prepare-data failed: {r.stderr}")
        env = dict(os.environ, RAYON_NUM_THREADS=str(a.threads), TOKENIZERS_PARALLELISM="true")
        r = subprocess.run([sys.executable, "-c", ENCODE_BATCH, str(tmp / "tokenizer.json"),
                            str(corpus), str(tmp / "ref.npy")],
                           capture_output=True, text=True, env=env)
        if r.returncode != 0:
            sys.exit(f"encode_batch failed: {r.stderr}")
        theirs = float(r.stdout.strip().splitlines()[-1])

        m = json.loads((out / "manifest.json").read_text())
        got = []
        for split in m["splits"].values():
            for sh in split:
                with h5py.File(out / sh["file"], "r") as f:
                    got.append(np.asarray(f["tokens"][:], dtype=np.int64))
        got = np.concatenate(got)
        ref = np.load(tmp / "ref.npy")
        same = got.shape == ref.shape and bool((got == ref).all())
        kind = ("Llama-2 (no pre-tokenizer)" if a.llama2 else "Llama-3 split" if a.llama3
                else "Qwen3 (NFC + split)" if a.qwen3 else "GPT-2 byte-level")
        print(f"corpus: {mb:.1f} MB JSONL, {a.docs} documents, {kind} BPE (8000 tokens), "
              f"{a.threads} threads, {len(ref)} ids")
        print(f"prepare-data (whole command): {ours:.2f} s  {mb / ours:.2f} MB/s")
        print(f"encode_batch (tokenizing only): {theirs:.2f} s  {mb / theirs:.2f} MB/s")
        print(f"ids identical: {same}")

        # Scaling: one document of S MB and one of 4S MB (--scaling-mb), whole command each.
        times = []
        for k in (1, 4):
            doc = tmp / f"one-{k}.jsonl"
            doc.write_text(json.dumps({"text": document(random.Random(k), int(k * a.scaling_mb * 1e6))},
                                      ensure_ascii=False) + "\n", encoding="utf-8")
            t = time.perf_counter()
            r = subprocess.run([a.moe_train, "-q", "prepare-data", str(doc), "--out",
                                str(tmp / f"one-{k}"), "--tokenizer", "hf", "--tokenizer-file",
                                str(tmp / "tokenizer.json"), "--jsonl", "--threads", str(a.threads)],
                               capture_output=True, text=True)
            times.append(time.perf_counter() - t)
            if r.returncode != 0:
                sys.exit(f"prepare-data failed: {r.stderr}")
        print(f"one document of {a.scaling_mb:g} MB: {times[0]:.2f} s; of {4 * a.scaling_mb:g} MB: "
              f"{times[1]:.2f} s; ratio {times[1] / times[0]:.2f} (linear: 4)")
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
