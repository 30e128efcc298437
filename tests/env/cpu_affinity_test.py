"""training.cpu_affinity and `moe-train env`'s placement report:
  - `env --json` reports the NUMA topology and this process's CPUs;
  - training with training.cpu_affinity = "0": every thread of the running process (the loader,
    the metrics writer, LibTorch's intra-op pool with OMP_NUM_THREADS=2) has Cpus_allowed_list 0,
    read from /proc/PID/task/*/status while it trains; SIGTERM still ends it with exit 0;
  - "auto" without a GPU trains, with a warning that placement is left to the OS;
  - a malformed list, and a CPU the process may not use: exit 2, one line naming the key,
    nothing written.
usage: cpu_affinity_test.py MOE_TRAIN_BINARY
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

BIN = sys.argv[1]

report = json.loads(subprocess.run([BIN, "env", "--json"], capture_output=True, text=True, check=True).stdout)
checks = {c["check"]: c for c in report["checks"]}
assert "NUMA" in checks and "CPU affinity" in checks, sorted(checks)
print(f"env: NUMA: {checks['NUMA']['detail']}; affinity: {checks['CPU affinity']['detail'][:60]}")

with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    subprocess.run([BIN, "make-synthetic", "--out", tmp / "data", "--vocab", "256", "--programs", "4",
                    "--doc-len", "65", "--train-docs", "400", "--valid-docs", "16"], check=True,
                   capture_output=True)
    cfg = tmp / "c.json"
    cfg.write_text(json.dumps({
        "train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
        "model": {"vocab_size": 256, "seq_len": 64, "hidden_size": 64, "num_layers": 2, "num_heads": 4},
        "moe": {"num_experts": 4, "top_k": 2, "expert_hidden_size": 96},
        "training": {"train_iters": 100000, "eval_interval": 0, "device": "cpu"},
        "data": {"train_path": str(tmp / "data/train.h5"), "valid_path": str(tmp / "data/valid.h5")}}))

    out = tmp / "pinned"
    p = subprocess.Popen([BIN, "--config", cfg, "--set", f"training.output_dir={out}", "--set",
                          'training.cpu_affinity="0"'], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    metrics = out / "metrics.jsonl"
    t0 = time.time()
    while not metrics.exists() or sum(1 for l in metrics.read_text().splitlines() if '"train"' in l) < 3:
        assert p.poll() is None, p.communicate()[1][-2000:]
        assert time.time() - t0 < 120, "no training steps"
        time.sleep(0.2)
    allowed = {}
    for task in pathlib.Path(f"/proc/{p.pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except FileNotFoundError:
            continue  # a thread that ended
        line = next(l for l in status.splitlines() if l.startswith("Cpus_allowed_list:"))
        allowed[task.name] = line.split(":", 1)[1].strip()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-2000:]
    assert len(allowed) > 2 and set(allowed.values()) == {"0"}, allowed
    assert "every thread pinned to CPUs 0" in err, err[-2000:]
    print(f"training.cpu_affinity = \"0\": all {len(allowed)} threads on CPU 0 while training; SIGTERM exit 0")

    r = subprocess.run([BIN, "--config", cfg, "-q", "--set", f"training.output_dir={tmp / 'auto'}", "--set",
                        'training.cpu_affinity="auto"', "--set", "training.train_iters=2"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "placement left to the OS" in r.stderr, r.stderr[-2000:]
    print("training.cpu_affinity = auto without a GPU: trains, placement left to the OS (warned)")

    for value, why in (('"0-x"', "expected \\\"auto\\\" or a CPU list"), ('"4000"', "is not available to this process")):
        out = tmp / "bad"
        r = subprocess.run([BIN, "--config", cfg, "-q", "--set", f"training.output_dir={out}", "--set",
                            f"training.cpu_affinity={value}", "--set", "training.train_iters=2"],
                           capture_output=True, text=True)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "training.cpu_affinity" in lines[0], (value, r.stderr)
        assert why.replace("\\", "") in lines[0], (value, lines[0])
        assert not (out / "checkpoints").exists() and not (out / "metrics.jsonl").exists(), "nothing written"
        print(f"training.cpu_affinity = {value}: exit 2: {lines[0][:160]}")
print("ok")
