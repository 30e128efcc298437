"""prepare-data with JSONL input: three files (plain, .gz, .zst) holding unicode and escaped text
prepare to exactly the tokens (and document offsets) of the same documents given as text files;
--append-eod puts the end-of-document id after every document; a malformed line is an error
naming file:line with nothing written, or is skipped and counted with --skip-bad-lines.

usage: jsonl_test.py MOE_TRAIN_BINARY
"""
import gzip
import json
import pathlib
import subprocess
import sys
import tempfile

import h5py
import numpy as np

BIN = sys.argv[1]
DOCS = [
    "Plain ASCII text, with \"quotes\" and a backslash \\ and a tab\there.",
    "Кириллица: съешь же ещё этих мягких французских булок.\nSecond line.",
    "中文和日本語のテキスト、한국어 텍스트。",
    "Emoji 😀🚀 and a surrogate pair, é composed and é decomposed.",
    "digits 0123456789 and    runs of     spaces\n\n\nand blank lines",
    "",  # an empty document
    "line\r\nwith a CRLF inside the string",
]


def prepare(tmp, out, *args, ok=True):
    r = subprocess.run([BIN, "prepare-data", *map(str, args), "--out", tmp / out], capture_output=True, text=True)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def read(ds):
    toks, offsets = [], []
    m = json.loads((ds / "manifest.json").read_text())
    for sh in m["splits"]["train"]:
        with h5py.File(ds / sh["file"], "r") as f:
            base = sum(len(t) for t in toks)
            toks.append(np.asarray(f["tokens"][:]))
            offsets += [base + int(o) for o in f["doc_offsets"][:]]
    return np.concatenate(toks), offsets, m


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    texts = []
    for i, doc in enumerate(DOCS):
        p = tmp / f"doc{i}.txt"
        p.write_bytes(doc.encode())
        texts.append(p)
    lines = [json.dumps({"id": i, "text": doc, "meta": {"lang": "x"}}, ensure_ascii=i % 2 == 0)
             for i, doc in enumerate(DOCS)]
    (tmp / "a.jsonl").write_text("\n".join(lines[:3]) + "\n")
    with gzip.open(tmp / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(lines[3:5]) + "\n\n")  # and a blank line
    (tmp / "c.jsonl").write_text("\n".join(lines[5:]))  # no final newline
    subprocess.run(["zstd", "-q", "--rm", tmp / "c.jsonl", "-o", tmp / "c.jsonl.zst"], check=True)

    for eod in ([], ["--append-eod", "--eod-id", "256"]):
        tag = "eod" if eod else "plain"
        prepare(tmp, f"text-{tag}", *texts, *eod)
        prepare(tmp, f"jsonl-{tag}", tmp / "a.jsonl", tmp / "b.jsonl.gz", tmp / "c.jsonl.zst", *eod)
        a_toks, a_off, a_m = read(tmp / f"text-{tag}")
        b_toks, b_off, b_m = read(tmp / f"jsonl-{tag}")
        assert np.array_equal(a_toks, b_toks), f"{tag}: JSONL tokens differ from the text files'"
        assert a_off == b_off and len(b_off) == len(DOCS), (a_off, b_off)
        if eod:
            assert b_m["eod_id"] == 256 and b_m["vocab_size"] == 257, b_m
            ends = [o - 1 for o in b_off[1:]] + [len(b_toks) - 1]
            assert all(b_toks[e] == 256 for e in ends) and (b_toks == 256).sum() == len(DOCS)
        print(f"{tag}: 3 JSONL files (plain, gz, zst) = {len(DOCS)} text files: {len(b_toks)} tokens, "
              f"document offsets {b_off}")

    bad = tmp / "bad.jsonl"
    bad.write_text(lines[0] + "\n" + lines[1] + "\n{\"text\": \"unterminated\n" + lines[2] + "\n"
                   + json.dumps({"body": "x"}) + "\n" + json.dumps({"text": 5}) + "\n")
    r = prepare(tmp, "bad-out", bad, ok=False)
    line = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(line) == 1 and f"{bad}:3:" in line[0], r.stderr
    assert not (tmp / "bad-out").exists() and not list(tmp.glob("bad-out.partial-*")), "nothing written"
    print(f"malformed line: {line[0][:150]}")
    r = prepare(tmp, "skip-out", bad, "--skip-bad-lines")
    m = json.loads((tmp / "skip-out/manifest.json").read_text())
    assert m["skipped_lines"] == 3 and "skipped 3 malformed" in r.stdout, (m, r.stdout)
    toks, offs, _ = read(tmp / "skip-out")
    assert len(offs) == 3, offs
    print(f"--skip-bad-lines: 3 lines skipped and counted, {len(offs)} documents kept")
    for content, needle in ((json.dumps({"body": "x"}), 'no "text" key'),
                            (json.dumps({"text": 5}), '"text" is not a string'),
                            ("[1, 2]", "expected a JSON object")):
        (tmp / "one.jsonl").write_text(content + "\n")
        r = prepare(tmp, "one-out", tmp / "one.jsonl", ok=False)
        assert r.returncode == 2 and f"one.jsonl:1: {needle}" in r.stderr, r.stderr
    r = prepare(tmp, "key-out", tmp / "a.jsonl", "--jsonl-key", "body", ok=False)
    assert r.returncode == 2 and 'no "body" key' in r.stderr, r.stderr
    r = prepare(tmp, "eod-out", *texts, "--append-eod", ok=False)
    assert r.returncode == 2 and "--eod-id" in r.stderr, r.stderr
    broken = tmp / "broken.jsonl.gz"
    broken.write_bytes((tmp / "b.jsonl.gz").read_bytes()[:20])
    r = prepare(tmp, "broken-out", broken, ok=False)
    assert r.returncode == 2 and "broken.jsonl.gz" in r.stderr and not (tmp / "broken-out").exists(), r.stderr
    print(f"truncated gzip: {r.stderr.strip()[:150]}")
    cut = tmp / "cut.jsonl.zst"
    cut.write_bytes((tmp / "c.jsonl.zst").read_bytes()[:-6])
    r = prepare(tmp, "cut-out", cut, ok=False)
    assert r.returncode == 2 and "cut.jsonl.zst" in r.stderr and not (tmp / "cut-out").exists(), r.stderr
    print(f"truncated zstd: {r.stderr.strip()[:150]}")
print("ok")
