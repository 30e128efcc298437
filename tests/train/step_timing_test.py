"""Step time is what the user waits for: a deliberately slow optimizer update
(MOE_TEST_SLOW_UPDATE_MS) shows up in every step's step_time_s, tokens_per_s follows from it,
the steps' times add up to no more than the run's wall clock, and MFU is the achieved model
TFLOP/s over monitor.peak_tflops (CPU, fp32). No speed is asserted, only where time is counted.
Usage: step_timing_test.py MOE_TRAIN_BIN"""
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from e2e import Checks, make_synthetic  # noqa: E402

BIN = sys.argv[1]
check = Checks()
SLOW_MS = 400

with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    make_synthetic(BIN, tmp / "data", vocab=32, programs=2, doc_len=33, train_docs=200, valid_docs=16)
    cfg = {
        "train_batch_size": 8,
        "model": {"vocab_size": 128, "seq_len": 32, "hidden_size": 32, "num_layers": 2, "num_heads": 2},
        "moe": {"num_experts": 4, "top_k": 2, "expert_hidden_size": 64},
        "data": {"train_path": str(tmp / "data/train.h5")},
        "training": {"train_iters": 6, "eval_interval": 0},
        "checkpoint": {"save_interval": 0, "save_final": False},
        "monitor": {"peak_tflops": 0.05},
    }
    cfg_path = tmp / "cfg.json"
    cfg_path.write_text(json.dumps(cfg))

    def run(name, env):
        t0 = time.monotonic()
        r = subprocess.run([BIN, "--config", str(cfg_path), "-q", "--set", f"training.output_dir={tmp / name}"],
                           capture_output=True, text=True, env={**os.environ, **env})
        wall = time.monotonic() - t0
        check(r.returncode == 0, f"{name}: exit {r.returncode} {r.stderr[-300:]}")
        recs = [json.loads(l) for l in open(tmp / name / "metrics.jsonl")]
        return [r for r in recs if r["type"] == "train"], wall

    fast, _ = run("fast", {})
    slow, slow_wall = run("slow", {"MOE_TEST_SLOW_UPDATE_MS": str(SLOW_MS)})
    times = [r["step_time_s"] for r in slow]
    check(len(slow) == 6 and all(t >= SLOW_MS / 1000 for t in times),
          f"every step counts its slow update ({SLOW_MS} ms): {[round(t, 3) for t in times]}")
    extra = statistics.median(s["step_time_s"] - f["step_time_s"] for s, f in zip(slow, fast))
    check(extra >= 0.9 * SLOW_MS / 1000,
          f"the slow run's steps are longer by the update's delay: median {extra:.3f} s")
    check(sum(times) <= slow_wall, f"steps add up to at most the wall clock: {sum(times):.2f} <= {slow_wall:.2f} s")
    tokens_per_step = 8 * 32
    check(all(abs(r["tokens_per_s"] - tokens_per_step / r["step_time_s"]) <= 1e-6 * r["tokens_per_s"] for r in slow),
          "tokens_per_s = tokens per step / step_time_s")
    check(all(abs(r["mfu"] - r["tflops"] / 0.05) <= 1e-9 * r["mfu"] and r["mfu_causal"] < r["mfu"] for r in slow),
          "mfu = achieved TFLOP/s / monitor.peak_tflops; the causal-half convention is lower")

sys.exit(check.exit_code())
