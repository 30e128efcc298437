"""Crash consistency: SIGKILL a deterministic CPU training job at N seeded random moments (with a
hook that widens checkpoint writes so some kills land inside them), restart it each time with
automatic resume, and compare the end with an uninterrupted run: final weights and optimizer
state byte for byte, metrics lines (timing fields aside). After every kill, `latest` must name a
complete, readable checkpoint. Usage: crash_test.py MOE_TRAIN_BIN [--kills N] [--seed S]
(CI runs N = 5; `--kills 20` is the acceptance run)."""
import argparse
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from e2e import Checks, error_lines, make_synthetic  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("binary")
ap.add_argument("--kills", type=int, default=5)
ap.add_argument("--seed", type=int, default=1)
args = ap.parse_args()
BIN = args.binary
TIMING = {"step_time_s", "tokens_per_s", "samples_per_s", "tflops", "mfu", "mfu_causal", "data_wait_s",
          "host_rss_bytes"}
rng = random.Random(args.seed)
check = Checks()


def rows(run_dir):
    return [{k: v for k, v in json.loads(l).items() if k not in TIMING} for l in open(run_dir / "metrics.jsonl")]


start = time.time()
with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    make_synthetic(BIN, tmp / "data", vocab=32, programs=3, doc_len=33, train_docs=600, valid_docs=32)
    cfg = {
        "train_batch_size": 8,
        "model": {"vocab_size": 128, "seq_len": 32, "hidden_size": 32, "num_layers": 2, "num_heads": 2,
                  "dropout": 0.1},
        "moe": {"num_experts": 4, "top_k": 2, "expert_hidden_size": 64},
        "data": {"train_path": str(tmp / "data/train.h5"), "valid_path": str(tmp / "data/valid.h5")},
        # Long enough that the job cannot finish between the kills.
        "training": {"train_iters": 30 * args.kills + 60, "eval_interval": 50, "eval_iters": 1},
        "checkpoint": {"save_interval": 4, "keep_last": 2},
    }
    (tmp / "cfg.json").write_text(json.dumps(cfg))
    ref, crash = tmp / "ref", tmp / "crash"
    r = subprocess.run([BIN, "--config", tmp / "cfg.json", "-q", "--set", f"training.output_dir={ref}"],
                       capture_output=True, text=True)
    check(r.returncode == 0, "uninterrupted reference run")
    env = {**os.environ, "MOE_TEST_PAUSE_IN_CHECKPOINT_MS": "40"}
    kills, restarts, inside_writes = 0, 0, 0
    while kills < args.kills:
        p = subprocess.Popen([BIN, "--config", tmp / "cfg.json", "-q", "--set", f"training.output_dir={crash}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        restarts += 1
        ckdir = crash / "checkpoints"
        if kills % 2 == 1:
            # Every other kill waits for a checkpoint write to be in progress (the pause hook
            # holds it open), so kills inside writes do not depend on the machine's speed.
            deadline = time.time() + 60
            while time.time() < deadline and p.poll() is None and not (
                    ckdir.exists() and any(q.name.startswith(".tmp-") for q in ckdir.iterdir())):
                time.sleep(0.002)
            time.sleep(rng.uniform(0.0, 0.03))
        else:
            time.sleep(rng.uniform(0.3, 1.5))  # startup takes ~0.4 s; steps and writes follow
        if p.poll() is not None:
            check(p.returncode == 0, f"run finished before the kill with exit {p.returncode}")
            break
        p.send_signal(signal.SIGKILL)
        p.wait()
        kills += 1
        if ckdir.exists() and any(q.name.startswith(".tmp-") for q in ckdir.iterdir()):
            inside_writes += 1
        latest = crash / "checkpoints/latest"
        if latest.exists():
            name = latest.read_text().strip()
            info = subprocess.run([BIN, "checkpoint", "info", crash / "checkpoints" / name], capture_output=True)
            ok = info.returncode == 0 and (crash / "checkpoints" / name / "state.json").exists()
            check(ok, f"kill {kills}: latest -> {name} is complete and readable")
    r = subprocess.run([BIN, "--config", tmp / "cfg.json", "-q", "--set", f"training.output_dir={crash}"],
                       capture_output=True, text=True, env=env)
    check(r.returncode == 0, f"final restart completes (exit {r.returncode}) after {kills} kills")
    for f in ["model.safetensors", "optimizer.safetensors"]:
        final = f"step-{30 * args.kills + 60:08d}"
        a = (ref / "checkpoints" / final / f).read_bytes()
        b = (crash / "checkpoints" / final / f).read_bytes()
        check(a == b, f"{f} byte-identical to the uninterrupted run")
    check(rows(ref) == rows(crash), "metrics identical to the uninterrupted run (timing and RSS aside)")
    check(args.kills < 2 or inside_writes > 0, f"{inside_writes} of the kills landed inside a checkpoint write")
print(f"{kills} kills ({inside_writes} inside checkpoint writes), {restarts} starts, "
      f"{time.time() - start:.1f} s; {len(check.failures)} failed")
sys.exit(check.exit_code())
