"""Loader throughput: the same prepare-data dataset read from local files and from a local S3 server
(moto's server mode on 127.0.0.1, signature checking on; tests/util/s3_server.py), by
loader_bench --dataset: one epoch with a cold shard cache (every shard fetched with ranged GETs,
verified, then read) and one with it warm. Prints the markdown tables for docs/benchmarks.md.
usage: python bench/s3_loader.py BUILD_DIR [MiB of text, default 64]
"""
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "util"))
from s3_server import S3Server  # noqa: E402

build = pathlib.Path(sys.argv[1])
mib = int(sys.argv[2]) if len(sys.argv) > 2 else 64
binary, bench = build / "src" / "moe-train", build / "bench" / "loader_bench"

with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    rng = random.Random(1)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(5000)]
    with open(tmp / "corpus.txt", "w") as f:
        written = 0
        while written < mib << 20:
            line = " ".join(rng.choice(words) for _ in range(200)) + "\n"
            f.write(line)
            written += len(line)
    srv = S3Server()
    # Straight to moto: the fault proxy is for the tests, not a server's throughput.
    env = {**os.environ, **srv.env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{srv.moto_port}"}
    try:
        # Shards of a quarter of the tokens each (prepare-data's last shard would otherwise be a
        # remainder, possibly shorter than one window).
        subprocess.run([binary, "prepare-data", tmp / "corpus.txt", "--out", tmp / "count", "--shard-tokens",
                        str(1 << 40)], check=True, capture_output=True)
        total = json.loads((tmp / "count" / "manifest.json").read_text())["splits"]["train"][0]["tokens"]
        prep = [binary, "prepare-data", tmp / "corpus.txt", "--shard-tokens", str((total + 3) // 4)]
        subprocess.run(prep + ["--out", tmp / "local"], check=True, capture_output=True)
        t0 = time.time()
        subprocess.run(prep + ["--out", "s3://moe-test/bench"], check=True, capture_output=True, env=env)
        print(f"prepare-data --out s3:// ({mib} MiB of text): {time.time() - t0:.1f} s including tokenizing\n")
        for path in (tmp / "local", "s3://moe-test/bench"):
            shutil.rmtree(tmp / "cache", ignore_errors=True)
            r = subprocess.run([bench, "--dataset", path, "--cache", tmp / "cache", "--seq-len", "2048",
                                "--batch", "8"], capture_output=True, text=True, env=env)
            assert r.returncode == 0, r.stderr[-2000:]
            print(r.stdout.replace(str(tmp / "local"), "local files"))
    finally:
        srv.close()
