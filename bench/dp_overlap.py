#!/usr/bin/env python3
"""Data-parallel gradient all-reduce overlap on CPU (Gloo, 2 ranks on 127.0.0.1), a benchmark,
not a test. Measures, for configs/bench-cpu-small.json (33 M parameters, 133 MB of fp32
gradients per step):
  compute   one process training its per-rank share (micro-batch 4), no communication
  comm      2 processes all-reducing 133 MB in 25 MB buckets with torch.distributed (Gloo)
  DP        torchrun 2 x micro-batch 4, all-reduce after the backward (zero_optimization.overlap_comm=false) and
            overlapped with it (c10d's Reducer, the default)
and prints the mean step time of each (steps after the first 3; OMP_NUM_THREADS=1 per rank).
usage: bench/dp_overlap.py [BUILD_DIR] [STEPS=15]"""
import json
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
env1 = {**os.environ, "OMP_NUM_THREADS": "1"}


COMM = r'''
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
n, bucket = int(os.environ["PARAMS"]), 25 * 2**20 // 4
grads = torch.randn(n)
times = []
for i in range(8):
    t0 = time.perf_counter()
    for b in range(0, n, bucket):
        dist.all_reduce(grads[b:b + bucket])
    times.append(time.perf_counter() - t0)
if dist.get_rank() == 0:
    print(sum(times[2:]) / len(times[2:]))
dist.destroy_process_group()
'''

with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    subprocess.run([binary, "make-synthetic", "--out", tmp / "data", "--vocab", "256", "--programs", "4",
                    "--doc-len", "257", "--train-docs", "2000", "--valid-docs", "16"], check=True,
                   capture_output=True)
    sets = ["--set", f"data.train_path={tmp}/data/train.h5", "--set", f"data.valid_path={tmp}/data/valid.h5",
            "--set", f"training.train_iters={steps}", "--set", "training.eval_interval=0",
            "--set", "checkpoint.save_final=false", "--set", "training.device=cpu"]
    cfg = str(root / "configs/bench-cpu-small.json")
    plan = json.loads(subprocess.run([binary, "plan", "--config", cfg, *sets, "--json"], check=True,
                                     capture_output=True, text=True).stdout)
    subprocess.run([binary, "--config", cfg, "-q", *sets, "--set", "train_batch_size=4",
                    "--set", f"training.output_dir={tmp}/compute"], check=True, env=env1,
                   capture_output=True)
    compute = mean_step(tmp / "compute")
    (tmp / "comm.py").write_text(COMM)
    r = subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", str(port()), tmp / "comm.py"],
                       check=True, capture_output=True, text=True,
                       env={**env1, "PARAMS": str(plan["parameters"])})
    comm = float(r.stdout.strip().splitlines()[-1])
    dp = {}
    for overlap in ("0", "1"):
        out = tmp / f"dp{overlap}"
        subprocess.run([torchrun, "--no-python", "--nproc-per-node", "2", "--master-port", str(port()),
                        binary, "--config", cfg, "-q", *sets, "--set", f"training.output_dir={out}",
                        "--set", f"zero_optimization.overlap_comm={'true' if overlap == '1' else 'false'}"],
                       check=True, capture_output=True, env=env1)
        dp[overlap] = mean_step(out)
    print(f"| bench-cpu-small, {plan['parameters'] / 1e6:.1f} M params, {plan['parameters'] * 4 / 2**20:.0f} MiB "
          f"of gradients | seconds/step |")
    print("|---|---|")
    print(f"| compute: 1 process, micro-batch 4 | {compute:.3f} |")
    print(f"| communication: Gloo all-reduce of the gradients, 2 processes | {comm:.3f} |")
    print(f"| compute + communication | {compute + comm:.3f} |")
    print(f"| DP 2 x 4, all-reduce after the backward | {dp['0']:.3f} |")
    print(f"| DP 2 x 4, all-reduce overlapped (c10d Reducer) | {dp['1']:.3f} |")
