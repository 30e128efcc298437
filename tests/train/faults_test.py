"""Numerical faults and a full disk, through the real binary (CPU, fp32).
- NaN injected into one layer's gradients for K = training.max_bad_steps steps in a row: exit 3,
  one line naming the step, that layer and the last good checkpoint; fewer bad steps are skipped.
- A non-finite loss is named as such.
- Checkpoints on a small tmpfs until it fills: the write fails naming the path and the bytes
  needed, `latest` keeps pointing at the previous (intact) checkpoint, exit 3; or, with
  checkpoint.on_failure = continue, training goes on. (Skipped when tmpfs cannot be mounted.)
Usage: faults_test.py MOE_TRAIN_BIN"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from e2e import Checks, error_lines, make_synthetic  # noqa: E402

BIN = sys.argv[1]
check = Checks()


def run(cfg_path, *extra, env=None):
    return subprocess.run([BIN, "--config", str(cfg_path), "-q", *map(str, extra)], capture_output=True,
                          text=True, env={**os.environ, **(env or {})})


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    make_synthetic(BIN, tmp / "data", vocab=32, programs=2, doc_len=33, train_docs=300, valid_docs=16)
    cfg = {
        "train_batch_size": 8,
        "model": {"vocab_size": 128, "seq_len": 32, "hidden_size": 32, "num_layers": 2, "num_heads": 2},
        "moe": {"num_experts": 4, "top_k": 2, "expert_hidden_size": 64},
        "data": {"train_path": str(tmp / "data/train.h5")},
        "training": {"output_dir": str(tmp / "nan"), "train_iters": 12},
        "checkpoint": {"save_interval": 2, "keep_last": 10},
    }
    cfg_path = tmp / "cfg.json"
    cfg_path.write_text(json.dumps(cfg))
    layer = "blocks.1.moe.experts.w_up"

    # K bad steps in a row: stop, naming step, layer and the last good checkpoint.
    r = run(cfg_path, env={"MOE_TEST_INJECT_NAN": f"grad:{layer}:5,6,7"})
    lines = error_lines(r)
    check(r.returncode == 3 and len(lines) == 1, f"3 NaN steps in a row: exit {r.returncode}, {lines}")
    msg = lines[0] if lines else ""
    check("at step 7" in msg and f"first non-finite gradients in {layer}" in msg and
          "last good checkpoint: " + str(tmp / "nan/checkpoints/step-00000006") in msg, f"message: {msg}")
    # Fewer than K: skipped, counted in the metrics, the run completes.
    r = run(cfg_path, "--overwrite", env={"MOE_TEST_INJECT_NAN": f"grad:{layer}:5,6"})
    rows = [json.loads(l) for l in open(tmp / "nan/metrics.jsonl")]
    skipped = [m["step"] for m in rows if m.get("skipped")]
    check(r.returncode == 0 and skipped == [5, 6], f"2 NaN steps are skipped and the run ends: exit {r.returncode}, skipped {skipped}")
    # A non-finite loss with max_bad_steps = 1.
    r = run(cfg_path, "--overwrite", "--set", "training.max_bad_steps=1", env={"MOE_TEST_INJECT_NAN": "loss:3"})
    lines = error_lines(r)
    check(r.returncode == 3 and lines and "non-finite loss at step 3" in lines[0], f"NaN loss: {lines}")

    # Disk full on a small tmpfs.
    mnt = tmp / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1200k", "tmpfs", str(mnt)], capture_output=True).returncode != 0:
        print("skip disk-full: cannot mount a tmpfs here (needs root)")
    else:
        try:
            full = dict(cfg, training=dict(cfg["training"], output_dir=str(mnt / "run")))
            (tmp / "full.json").write_text(json.dumps(full))
            r = run(tmp / "full.json")
            lines = error_lines(r)
            ck = mnt / "run/checkpoints"
            check(r.returncode == 3 and len(lines) == 1 and "bytes" in lines[0] and str(ck) in lines[0],
                  f"disk full: exit {r.returncode}, {lines}")
            latest = (ck / "latest").read_text().strip()
            check(latest == "step-00000002" and not any(p.name.startswith(".tmp") for p in ck.iterdir()),
                  f"latest still {latest}, no partial directory left")
            info = subprocess.run([BIN, "checkpoint", "info", ck / latest], capture_output=True, text=True)
            check(info.returncode == 0, "the previous checkpoint is intact and readable")
            # on_failure = continue: the run ends normally, with the failed saves logged.
            subprocess.run(["rm", "-rf", str(mnt / "run")])
            r = run(tmp / "full.json", "--set", "checkpoint.on_failure=continue", "--set", "checkpoint.save_final=false")
            rows = [json.loads(l) for l in open(mnt / "run/metrics.jsonl")]
            check(r.returncode == 0 and sum(m["type"] == "train" for m in rows) == 12 and "training continues" in r.stderr,
                  f"on_failure=continue finishes the run: exit {r.returncode}")
        finally:
            subprocess.run(["umount", str(mnt)])

print(f"{len(check.failures)} failed")
sys.exit(check.exit_code())
