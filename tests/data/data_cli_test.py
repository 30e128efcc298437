"""Data pipeline acceptance through the real binary: h5py interop, tinyshakespeare prepare/verify,
and every bad-shard case of the data issue (exit 2, one line naming the file, no training step).
Usage: data_cli_test.py MOE_TRAIN_BIN SHARED_DATA_DIR. Exit 77 (ctest SKIP) without h5py."""
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
except ImportError:
    print("h5py/numpy not installed: skipping")
    sys.exit(77)

BIN = sys.argv[1]
SHARED = pathlib.Path(sys.argv[2])
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(*args):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True)


def h5py_shard(path, tokens, vocab, dtype=np.uint16, attrs=True):
    with h5py.File(path, "w") as f:
        f.create_dataset("tokens", data=np.asarray(tokens, dtype=dtype), chunks=True)
        if attrs:
            f.attrs["format_version"] = 1
            f.attrs["vocab_size"] = vocab
            f.attrs["tokenizer"] = "h5py-fixture"  # variable-length str, as h5py writes it


def config(tmp, train, valid="", out="run", **data):
    cfg = {
        "train_batch_size": 4,
        "scheduler": {"type": "Constant"},
        "model": {"vocab_size": 64, "seq_len": 16, "hidden_size": 16, "num_layers": 1, "num_heads": 2},
        "moe": {"num_experts": 2, "top_k": 1, "expert_hidden_size": 16},
        "data": {"train_path": str(train), "valid_path": str(valid), **data} if train else data,
        "training": {"output_dir": str(tmp / out), "train_iters": 3, "eval_iters": 1},
    }
    p = tmp / f"{out}.json"
    p.write_text(json.dumps(cfg))
    return p


def expect_data_error(tmp, name, cfg_path, needle):
    r = run("--config", cfg_path)
    # Log lines may precede it; the error itself is exactly one line.
    lines = [l for l in r.stderr.strip().splitlines() if l.startswith("moe-train:")]
    check(r.returncode == 2, f"{name}: exit 2 (got {r.returncode})")
    check(len(lines) == 1 and needle in lines[0], f"{name}: one line naming '{needle}': {r.stderr.strip()!r}")
    check("Traceback" not in r.stderr and "terminate called" not in r.stderr, f"{name}: no crash")
    check(not (tmp / "run_bad" / "metrics.jsonl").exists(), f"{name}: no training step ran")


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    rng = np.random.default_rng(0)

    # 1. A shard written by h5py trains.
    h5py_shard(tmp / "py.h5", rng.integers(0, 64, 17 * 40), 64)
    r = run("--config", config(tmp, tmp / "py.h5", tmp / "py.h5", out="run_py"))
    check(r.returncode == 0, f"h5py-written shard trains (exit {r.returncode}: {r.stderr.strip()[-200:]})")

    # 2. A shard we write reads back in h5py with the same tokens.
    text = b"The quick brown fox jumps over the lazy dog.\n" * 50
    (tmp / "in.txt").write_bytes(text)
    r = run("prepare-data", tmp / "in.txt", "--out", tmp / "ds")
    check(r.returncode == 0, "prepare-data on a small text")
    with h5py.File(tmp / "ds" / "train-00000.h5", "r") as f:
        check(bytes(f["tokens"][:].astype(np.uint8)) == text, "h5py reads our tokens back unchanged")
        check(int(f.attrs["vocab_size"]) == 256 and int(f.attrs["format_version"]) == 1, "attributes")

    # 3. Bad shards: each a clear one-line error naming the file, exit 2, before any step.
    good = rng.integers(0, 64, 17 * 40)
    cases = tmp / "bad"
    cases.mkdir()
    h5py_shard(cases / "ok.h5", good, 64)
    data = (cases / "ok.h5").read_bytes()
    (cases / "truncated.h5").write_bytes(data[: len(data) // 2])
    (cases / "not_hdf5.h5").write_bytes(b"this is plain text, not HDF5\n" * 10)
    h5py_shard(cases / "float.h5", good, 64, dtype=np.float32)
    h5py_shard(cases / "range.h5", np.concatenate([good, [70]]), 64)
    h5py_shard(cases / "short.h5", good[:10], 64)
    h5py_shard(cases / "noattrs.h5", good, 64, attrs=False)
    for name, path, needle in [
        ("missing shard", cases / "missing.h5", "missing.h5"),
        ("truncated file", cases / "truncated.h5", "truncated.h5"),
        ("not an HDF5 file", cases / "not_hdf5.h5", "not an HDF5 file"),
        ("wrong dtype", cases / "float.h5", "expected uint16 or uint32"),
        ("token id >= vocab", cases / "range.h5", "token at offset 680 is 70"),
        ("shorter than one window", cases / "short.h5", "one window needs seq_len + 1 = 17"),
        ("missing attributes", cases / "noattrs.h5", "missing attribute 'format_version'"),
    ]:
        expect_data_error(tmp, name, config(tmp, path, out="run_bad"), needle)

    # Checksum mismatch through a manifest (data.path + data.verify_checksums).
    r = run("prepare-data", tmp / "in.txt", "--out", tmp / "ds2", "--valid-fraction", "0.2")
    shard = tmp / "ds2" / "train-00000.h5"
    raw = bytearray(shard.read_bytes())
    raw[-100] ^= 0x01
    shard.write_bytes(bytes(raw))
    cfg = config(tmp, None, out="run_bad", path=str(tmp / "ds2"), verify_checksums=True)
    c = json.loads(cfg.read_text())
    c["model"]["vocab_size"] = 256
    cfg.write_text(json.dumps(c))
    expect_data_error(tmp, "checksum mismatch", cfg, "train-00000.h5: md5")

    # 4. tinyshakespeare: byte tokens = bytes; verify passes, then fails after one flipped byte.
    src = SHARED / "tinyshakespeare.txt"
    if src.exists():
        out = tmp / "shakespeare"
        r = run("prepare-data", src, "--out", out, "--valid-fraction", "0.1", "--shard-tokens", "250000")
        check(r.returncode == 0, "prepare-data tinyshakespeare")
        m = json.loads((out / "manifest.json").read_text())
        total = sum(s["tokens"] for split in m["splits"].values() for s in split)
        check(total == src.stat().st_size, f"token count {total} == byte count {src.stat().st_size}")
        for split in m["splits"].values():
            for s in split:
                md5 = hashlib.md5((out / s["file"]).read_bytes()).hexdigest()
                check(md5 == s["md5"], f"{s['file']}: manifest md5 equals hashlib's")
        r = run("verify-data", out)
        check(r.returncode == 0, "verify-data passes on fresh shards")
        victim = out / m["splits"]["train"][1]["file"]
        raw = bytearray(victim.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        victim.write_bytes(bytes(raw))
        r = run("verify-data", out)
        check(r.returncode == 2 and victim.name in r.stderr and "md5" in r.stderr,
              f"verify-data fails after one flipped byte: {r.stderr.strip()!r}")
    else:
        print("skip tinyshakespeare: ../shared/data/tinyshakespeare.txt absent")

print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
