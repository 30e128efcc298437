"""training.profile_step_start/end: the torch profiler over a window of steps. A CPU run writes a
Chrome trace that holds the window's steps (ProfilerStep#N spans) and their operators, and logs
the table of host operators by self time; a window cut short by the run's end is still written;
a window outside the run warns; bad windows are one-line config errors.

usage: step_trace_test.py MOE_TRAIN_BINARY
"""
import json
import pathlib
import re
import subprocess
import sys
import tempfile

BIN = sys.argv[1]


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        sys.exit(1)


def train(tmp, name, steps, **training):
    cfg = {
        "train_batch_size": 4,
        "model": {"vocab_size": 128, "seq_len": 32, "hidden_size": 32, "num_layers": 2, "num_heads": 4,
                  "rope_theta": 10000},
        "moe": {"num_experts": 4, "top_k": 2, "expert_hidden_size": 64},
        "data": {"train_path": str(tmp / "data/train.h5"), "valid_path": str(tmp / "data/valid.h5")},
        "training": {"output_dir": str(tmp / name), "train_iters": steps, "eval_iters": 1,
                     "eval_interval": 2, **training},
        "checkpoint": {"save_interval": 2},
    }
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return subprocess.run([BIN, "--config", path], capture_output=True, text=True)


def trace_steps(file):
    doc = json.loads(file.read_text())
    events = doc["traceEvents"]
    steps = sorted({int(e["name"].split("#")[1]) for e in events
                    if str(e.get("name", "")).startswith("ProfilerStep#")})
    return events, steps


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    r = subprocess.run([BIN, "make-synthetic", "--out", tmp / "data", "--vocab", "64", "--programs", "4",
                        "--doc-len", "33", "--train-docs", "256", "--valid-docs", "32"],
                       capture_output=True, text=True)
    check(r.returncode == 0, "make-synthetic")

    # Steps 3 and 4 of 6; validation and a checkpoint after step 4 are outside the window.
    r = train(tmp, "window", 6, profile_step_start=3, profile_step_end=5)
    check(r.returncode == 0, f"training with a trace window (exit {r.returncode}) {r.stderr[-800:]}")
    file = tmp / "window/profile/rank0.steps3-4.pt.trace.json"
    check(file.exists(), f"the trace is {file.name} under OUTPUT_DIR/profile")
    events, steps = trace_steps(file)
    check(steps == [3, 4], f"the trace holds steps 3 and 4 and no other (got {steps})")
    names = {e.get("name") for e in events}
    check(any(n in names for n in ("aten::mm", "aten::addmm", "aten::bmm")),
          "the trace holds the steps' matrix products")
    check(any(n == "aten::scaled_dot_product_attention" for n in names), "and the attention")
    check(not any(str(n).startswith("aten::save") for n in names), "no checkpoint inside the window")
    log = r.stderr
    check(log.count("trace: 2 step(s)") == 1, "one table, of two steps, in the log")
    m = re.search(r"trace: 2 step\(s\), ([0-9.]+) ms/step wall; host operators by self time", log)
    check(m is not None and float(m.group(1)) > 0, "the table's header gives the wall time per step")
    table = log[log.index("trace: 2 step(s)"):].splitlines()[1:17]
    rows = [l for l in table if re.search(r"\s[0-9.]+\s+[0-9.]+%\s+\d+\s+\S", l)]
    check(len(rows) >= 10, f"at least ten operator rows ({len(rows)})")
    shares = [float(re.search(r"([0-9.]+)%", l).group(1)) for l in rows]
    check(shares == sorted(shares, reverse=True), "rows longest first")
    check(sum(shares) <= 100.5, f"self times do not add up past the wall time ({sum(shares):.1f}%)")
    check(any("ProfilerStep (outside operators)" in l or "aten::" in l for l in rows),
          "rows name operators")
    check(f"trace: written to {file}" in log, "the log names the file")

    # A window past the run's end is written when the run ends.
    r = train(tmp, "cut", 3, profile_step_start=3, profile_step_end=10)
    check(r.returncode == 0, f"window past the end (exit {r.returncode}) {r.stderr[-500:]}")
    _, steps = trace_steps(tmp / "cut/profile/rank0.steps3-9.pt.trace.json")
    check(steps == [3], f"the cut window holds step 3 (got {steps})")
    check("trace: 1 step(s)" in r.stderr, "and its table is logged")

    # One step by default; a window the run never reaches warns and writes nothing.
    r = train(tmp, "one", 2, profile_step_start=2)
    _, steps = trace_steps(tmp / "one/profile/rank0.steps2-2.pt.trace.json")
    check(r.returncode == 0 and steps == [2], f"profile_step_end 0 = one step (got {steps})")
    r = train(tmp, "outside", 2, profile_step_start=5)
    check(r.returncode == 0 and "nothing is profiled" in r.stderr and not (tmp / "outside/profile").exists(),
          "a window outside the run warns and writes nothing")

    for training, expect in [({"profile_step_start": 4, "profile_step_end": 4},
                              "training.profile_step_end = 4: must be > training.profile_step_start (4)"),
                             ({"profile_step_end": 3}, "training.profile_step_end = 3: needs training.profile_step_start"),
                             ({"profile_step_start": -1}, "training.profile_step_start = -1")]:
        r = train(tmp, "bad", 4, **training)
        lines = [l for l in r.stderr.splitlines() if "error" in l]
        check(r.returncode == 2 and len(lines) == 1 and expect in lines[0],
              f"{training}: exit 2 and one line '{expect}' (exit {r.returncode}: {r.stderr[-300:]})")
        check(not (tmp / "bad").exists(), "nothing written for a bad config")
print("all checks passed")
