#!/usr/bin/env python3
"""Expert parallelism against plain data parallelism on CPU (Gloo, 2 ranks on 127.0.0.1), a
benchmark, not a test. configs/bench-cpu-small.json under torchrun, 2 x micro-batch 4, with
  DP        moe.expert_parallel_size=1 (every rank holds every expert; all-reduce after the backward)
  EP        moe.expert_parallel_size=2 (each rank half the experts; two all-to-alls per MoE layer
            each way, expert gradients reduced over their replicas: none at EP = world)
and EP with ZeRO-1. Prints the mean step time (steps after the first 3; OMP_NUM_THREADS=1 per
rank) and the larger rank's peak of live CPU tensor bytes (MOE_HOST_MEMORY_REPORT=1).
usage: bench/expert_parallel.py [BUILD_DIR] [STEPS=15]"""
import os
import pathlib
import subprocess
import sys
import tempfile

from launch_common import mean_step, port

root = pathlib.Path(__file__).resolve().parent.parent
build = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else root / "build"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 15
binary = str(build / "src" / "moe-train")
torchrun = str(pathlib.Path(sys.executable).parent / "torchrun")


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    subprocess.run([binary, "make-synthetic", "--out", tmp / "data", "--vocab", "256", "--programs", "4",
                    "--doc-len", "257", "--train-docs", "2000", "--valid-docs", "16"], check=True,
                   capture_output=True)
    sets = ["--set", f"data.train_path={tmp}/data/train.h5", "--set", f"data.valid_path={tmp}/data/valid.h5",
            "--set", f"training.train_iters={steps}", "--set", "training.eval_interval=0",
            "--set", "checkpoint.save_final=false", "--set", "training.device=cpu",
            "--set", "train_batch_size=8", "--set", "train_micro_batch_size_per_gpu=4"]
    cfg = str(root / "configs/bench-cpu-small.json")
    runs = {"DP (EP=1), all-reduce after the backward": ["zero_optimization.overlap_comm=false"],
            "EP=2": ["moe.expert_parallel_size=2"],
            "EP=2, ZeRO-1": ["moe.expert_parallel_size=2", "zero_optimization.stage=1"]}
    print(f"{'run':44s} {'s/step':>8s} {'peak MiB (larger rank)':>24s}")
    for name, extra in runs.items():
        out = tmp / name.replace(" ", "_").replace(",", "").replace("(", "").replace(")", "").replace("=", "")
        args = [torchrun, "--no-python", "--nproc-per-node", "2", "--master-port", str(port()), binary,
                "--config", cfg, "-q", *sets, "--set", f"training.output_dir={out}"]
        for s in extra:
            args += ["--set", s]
        r = subprocess.run(args, check=True, capture_output=True, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1", "MOE_HOST_MEMORY_REPORT": "1"})
        peaks = [int(l.split("peak ")[1].split(" ")[0]) for l in r.stderr.splitlines()
                 if "host tensor memory: peak" in l]
        print(f"{name:44s} {mean_step(out):8.3f} {max(peaks) / 2**20:24.1f}")
