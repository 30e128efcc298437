"""Monitoring through the real binary: TensorBoard event files read back with TensorBoard's own
reader, CSV files, the Prometheus endpoint during a run (its loss gauge against the metrics file),
a port that cannot be bound, and `systemd-analyze verify` on the shipped unit.
Usage: monitor_test.py MOE_TRAIN_BIN REPO_ROOT UNIT_DIR. Exit 77 (ctest SKIP) without the tensorboard package."""
import json
import math
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from e2e import Checks, error_lines, make_synthetic  # noqa: E402

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError:
    print("tensorboard not installed: skipping")
    sys.exit(77)

BIN, ROOT = sys.argv[1], pathlib.Path(sys.argv[2])
UNIT_DIR = pathlib.Path(sys.argv[3])  # the units CMake wrote from scripts/*.service.in
check = Checks()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    make_synthetic(BIN, tmp / "data", vocab=32, programs=2, doc_len=17, train_docs=400, valid_docs=32)
    cfg = {
        "train_batch_size": 8,
        "steps_per_print": 1000,
        "model": {"vocab_size": 128, "seq_len": 16, "hidden_size": 16, "num_layers": 2, "num_heads": 2},
        "moe": {"num_experts": 4, "top_k": 2, "expert_hidden_size": 16},
        "data": {"train_path": str(tmp / "data/train.h5"), "valid_path": str(tmp / "data/valid.h5")},
        "training": {"output_dir": str(tmp / "run"), "train_iters": 12, "eval_interval": 6, "eval_iters": 1},
        "tensorboard": {"enabled": True, "job_name": "tb_job"},
        "csv_monitor": {"enabled": True, "job_name": "csv_job"},
    }
    (tmp / "cfg.json").write_text(json.dumps(cfg))
    r = subprocess.run([BIN, "--config", tmp / "cfg.json", "-q"], capture_output=True, text=True)
    check(r.returncode == 0, f"training with tensorboard and csv_monitor ({r.stderr[-200:]})")
    rows = [json.loads(l) for l in open(tmp / "run/metrics.jsonl")]
    train = {m["step"]: m for m in rows if m["type"] == "train"}

    # TensorBoard, read by TensorBoard.
    tb_dir = tmp / "run/tensorboard/tb_job"
    files = list(tb_dir.glob("events.out.tfevents.*"))
    check(len(files) == 1, f"one event file in {tb_dir}")
    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    tags = acc.Tags()
    for t in ["train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "eval/loss", "eval/accuracy"]:
        check(t in tags["scalars"], f"scalar tag {t}")
    loss = acc.Scalars("train/loss")
    check([e.step for e in loss] == list(range(1, 13)), "train/loss at steps 1..12")
    check(all(math.isclose(e.value, train[e.step]["loss"], rel_tol=1e-6) for e in loss),
          "train/loss values equal the metrics file (float32)")
    check([e.step for e in acc.Scalars("eval/loss")] == [0, 6, 12], "eval/loss at steps 0, 6, 12")
    check("train/expert_tokens/layer0" in tags["histograms"], "expert-load histogram per layer")
    h = acc.Histograms("train/expert_tokens/layer1")[-1].histogram_value
    check(h.num == 4 and math.isclose(h.sum, sum(train[12]["expert_tokens"][1])), "histogram holds the 4 expert loads")

    # CSV.
    csv = (tmp / "run/csv/csv_job/train.csv").read_text().splitlines()
    check(csv[0].startswith("step,") and len(csv) == 13, f"train.csv: header + 12 rows ({len(csv)} lines)")

    # Prometheus during a run.
    port = free_port()
    long_cfg = dict(cfg, training=dict(cfg["training"], output_dir=str(tmp / "prom"), train_iters=100000,
                                       eval_interval=0), monitor={"prometheus": {"port": port}})
    (tmp / "prom.json").write_text(json.dumps(long_cfg))
    p = subprocess.Popen([BIN, "--config", tmp / "prom.json", "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    body, deadline = "", time.time() + 60
    while time.time() < deadline:
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            if re.search(r"^moe_train_step (\d+)", body, re.M) and int(re.search(r"^moe_train_step (\S+)", body, re.M).group(1).split(".")[0]) >= 3:
                break
        except OSError:
            pass
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=60)
    check(p.returncode == 0, "SIGTERM ends the Prometheus run with exit 0")
    sample = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")*\})? [-+0-9.eEInfNa]+$')
    lines = [l for l in body.splitlines() if l]
    bad = [l for l in lines if not l.startswith("# HELP ") and not l.startswith("# TYPE ") and not sample.match(l)]
    check(lines and not bad, f"exposition text is well formed ({len(lines)} lines, bad: {bad[:3]})")
    vals = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\w+) (\S+)$", body, re.M)}
    step = int(vals["moe_train_step"])
    prom_rows = {m["step"]: m for m in map(json.loads, open(tmp / "prom/metrics.jsonl")) if m["type"] == "train"}
    check(math.isclose(vals["moe_train_loss"], prom_rows[step]["loss"], rel_tol=1e-12),
          f"moe_train_loss at step {step} equals the metrics file")
    check(vals["moe_train_tokens_total"] == prom_rows[step]["tokens"], "moe_train_tokens_total counts tokens")
    check('moe_train_expert_tokens{layer="1",expert="3"}' in body, "per-expert load gauges")
    check("# TYPE moe_train_tokens_total counter" in body, "counters are typed")

    # A port that cannot be bound: exit 2, one line, nothing written.
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    busy = dict(long_cfg, monitor={"prometheus": {"port": blocker.getsockname()[1]}},
                training=dict(long_cfg["training"], output_dir=str(tmp / "busy")))
    (tmp / "busy.json").write_text(json.dumps(busy))
    r = subprocess.run([BIN, "--config", tmp / "busy.json", "-q"], capture_output=True, text=True)
    blocker.close()
    check(r.returncode == 2 and "cannot listen on 127.0.0.1:" in r.stderr and not (tmp / "busy/metrics.jsonl").exists(),
          f"busy port: exit {r.returncode}, {r.stderr.strip()[-160:]!r}")

    # systemd-analyze verify on the units CMake wrote for the build's prefix (UNIT_DIR), with this
    # build's binary and wrapper and an existing user (tests/cli/install_test.py verifies the
    # installed ones, man page included).
    if shutil.which("systemd-analyze"):
        for name in ("moe-train.service", "moe-train-multigpu.service"):
            unit = (UNIT_DIR / name).read_text()
            unit = re.sub(r"(?<=[\s=])/\S*/libexec/moe-train/moe-train-launch", str(ROOT / "scripts/moe-train-launch"), unit)
            unit = re.sub(r"(?<=[\s=])/\S*/bin/moe-train(?=\s)", str(pathlib.Path(BIN).resolve()), unit)
            unit = re.sub(r"(?<=[\s=])/\S*/bin/torchrun", str(pathlib.Path(sys.executable).parent / "torchrun"), unit)
            unit = unit.replace("User=moe", "User=root").replace("Group=moe", "Group=root")
            unit = unit.replace("/srv/moe-train", str(tmp))
            (tmp / name).write_text(unit)
            r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp / name)],
                               capture_output=True, text=True)
            problems = [l for l in (r.stdout + r.stderr).splitlines() if name in l]
            check(r.returncode == 0 and not problems, f"systemd-analyze verify {name}: rc {r.returncode} {problems}")
    else:
        print("skip systemd-analyze: not installed")

    # moe-train env: valid JSON; without a GPU the GPU check is a clear warn, not a crash.
    r = subprocess.run([BIN, "env", "--json", "--dir", str(tmp)], capture_output=True, text=True)
    report = json.loads(r.stdout) if r.returncode == 0 else {}
    gpu = [c for c in report.get("checks", []) if c["check"].startswith("GPU")]
    have_gpu = any(c["check"].startswith("GPU ") for c in gpu)
    check(r.returncode == 0 and gpu and (have_gpu or gpu[0]["verdict"] == "warn"),
          f"env --json: exit {r.returncode}, GPU checks {gpu}")
    r = subprocess.run([BIN, "env"], capture_output=True, text=True)
    check(r.returncode == 0 and any(l.startswith(("ok ", "warn ")) for l in r.stdout.splitlines()),
          "env prints a verdict per check")

print(f"{len(check.failures)} failed")
sys.exit(check.exit_code())
