#!/usr/bin/env python3
"""Fraction of training step time spent waiting for data, from moe-train's metrics file.
Runs the tiny demo config and configs/bench-cpu-small.json (byte-level tinyshakespeare shards,
prepared on first use) and prints a table. Usage: bench/data_wait.py [BUILD_DIR]"""
import json
import pathlib
import subprocess
import sys

root = pathlib.Path(__file__).resolve().parent.parent
build = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else root / "build"
binary = build / "src" / "moe-train"
shakespeare = root.parent / "shared" / "data" / "tinyshakespeare.txt"

if not (root / "data" / "tiny" / "train.h5").exists():
    subprocess.run([binary, "make-synthetic", "--out", root / "data/tiny", "--vocab", "64", "--programs", "4",
                    "--doc-len", "65", "--train-docs", "4000", "--valid-docs", "256"], check=True, cwd=root)
if not (root / "data" / "shakespeare" / "manifest.json").exists():
    subprocess.run([binary, "prepare-data", shakespeare, "--out", root / "data/shakespeare",
                    "--valid-fraction", "0.1"], check=True, cwd=root)

print("| config | steps | mean step s | mean data wait | wait share | tokens/s |")
print("|---|---|---|---|---|---|")
for cfg in ["configs/tiny.json", "configs/bench-cpu-small.json"]:
    subprocess.run([binary, "--config", cfg, "--overwrite", "-q"], check=True, cwd=root,
                   stdout=subprocess.DEVNULL)
    out = json.loads((root / cfg).read_text())["training"]["output_dir"]
    rows = [json.loads(l) for l in open(root / out / "metrics.jsonl")]
    steps = [r for r in rows if r["type"] == "train"][1:]  # step 1 includes warm-up
    step = sum(r["step_time_s"] for r in steps)
    wait = sum(r["data_wait_s"] for r in steps)
    tps = sum(r["tokens_per_s"] for r in steps) / len(steps)
    print(f"| {cfg} | {len(steps)} | {step / len(steps):.4f} | {1e6 * wait / len(steps):.1f} us | "
          f"{100 * wait / step:.4f}% | {tps:,.0f} |")
