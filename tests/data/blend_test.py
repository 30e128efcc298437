"""data.blend through the real binary (CPU): two prepare-data datasets of distinct token ranges
(bytes 'a'..'m' and '0'..'9') blended 0.75/0.25; 40 steps straight and 20 + resume to 40 end
bitwise equal; the smaller source wraps around and the log and metrics say so; eval reports each
source; bad blend entries are one-line errors naming the key, with nothing written.

usage: blend_test.py MOE_TRAIN_BINARY
"""
import json
import pathlib
import random
import subprocess
import sys
import tempfile

BIN = sys.argv[1]
FAILED = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        FAILED.append(what)


def run(*args):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True)


def metrics(d):
    return [json.loads(l) for l in open(d / "metrics.jsonl")]


with tempfile.TemporaryDirectory() as tmpdir:
    tmp = pathlib.Path(tmpdir)
    rng = random.Random(5)
    # A: ~40 kB of letters a..m; B: ~2.6 kB of digits (about 70 windows of 33: wraps in 40 steps).
    (tmp / "a.txt").write_text("".join(rng.choice("abcdefghijklm") for _ in range(40000)))
    (tmp / "b.txt").write_text("".join(rng.choice("0123456789") for _ in range(2600)))
    for name in ("a", "b"):
        r = run("prepare-data", tmp / f"{name}.txt", "--valid-fraction", "0.1", "--out", tmp / name)
        check(r.returncode == 0, f"prepare-data {name}: {r.stderr[-200:]}")
    cfg = {
        "train_batch_size": 8,
        "optimizer": {"params": {"lr": 3e-3}},
        "gradient_clipping": 1.0,
        "steps_per_print": 100,
        "model": {"vocab_size": 256, "seq_len": 32, "hidden_size": 32, "num_layers": 2, "num_heads": 2},
        "moe": {"num_experts": 4, "top_k": 2, "expert_hidden_size": 64},
        "data": {"blend": [{"path": str(tmp / "a"), "weight": 0.75},
                           {"path": str(tmp / "b"), "weight": 0.25}],
                 "block_windows": 16},
        "training": {"train_iters": 40, "eval_interval": 20, "eval_iters": 2},
        "checkpoint": {"save_interval": 20, "keep_last": 5},
        "tensorboard": {"enabled": True, "job_name": "tb"},
        "csv_monitor": {"enabled": True, "job_name": "csv"},
    }
    cfg_path = tmp / "cfg.json"
    cfg_path.write_text(json.dumps(cfg))

    # 1. 40 straight vs 20, stop, resume to 40: bitwise equal.
    a, b = tmp / "straight", tmp / "resumed"
    r = run("--config", cfg_path, "--set", f"training.output_dir={a}")
    check(r.returncode == 0, f"straight run (exit {r.returncode}) {r.stderr[-300:]}")
    check("data.blend[1] (b) wrapped around" in r.stderr, "the wrap-around of source b is logged")
    r = run("--config", cfg_path, "--set", f"training.output_dir={b}", "--set", "training.exit_interval=20")
    check(r.returncode == 0 and "stopped after step 20" in r.stdout, "stop at step 20")
    r = run("--config", cfg_path, "--set", f"training.output_dir={b}")
    check(r.returncode == 0 and "resuming from step 20" in r.stderr, "resume from step 20")
    for f in ["model.safetensors", "optimizer.safetensors"]:
        same = (a / "checkpoints/step-00000040" / f).read_bytes() == (b / "checkpoints/step-00000040" / f).read_bytes()
        check(same, f"step 40 {f} bitwise equal after resume")
    ta = [m for m in metrics(a) if m["type"] == "train"]
    tb = [m for m in metrics(b) if m["type"] == "train"]
    check([m["loss"] for m in ta] == [m["loss"] for m in tb], "the 40 train losses are identical")

    # 2. Metrics: each step says which pass each source is in; b (about 70 windows, read 80 times
    # in 320 sequences) wrapped, a did not.
    check(ta[0]["source_passes"] == [1, 1], f"step 1 passes {ta[0].get('source_passes')}")
    check(ta[-1]["source_passes"] == [1, 2], f"step 40 passes {ta[-1].get('source_passes')}")
    check(tb[-1]["source_passes"] == [1, 2], "the resumed run counts the same passes")

    # 3. Eval per source: loss and accuracy for a and b besides the overall figures.
    ev = [m for m in metrics(a) if m["type"] == "eval"]
    check(len(ev) == 3, f"eval at steps 0, 20, 40 ({len(ev)} records)")
    src = ev[-1].get("sources", {})
    check(sorted(src) == ["a", "b"], f"eval sources {sorted(src)}")
    check(all(0 < src[n]["loss"] < 10 and 0 <= src[n]["accuracy"] <= 1 for n in src),
          f"per-source loss and accuracy {src}")
    check("step 40: validation of b: loss" in r.stderr, "per-source validation logged")
    # The overall figures of a blend are the blend's weighted mean over its sources.
    want = 0.75 * src["a"]["loss"] + 0.25 * src["b"]["loss"]
    check(abs(ev[-1]["loss"] - want) < 1e-9, f"overall loss {ev[-1]['loss']} = weighted mean {want}")

    # The monitors carry the per-source figures: CSV columns and TensorBoard scalars.
    header = (a / "csv/csv/eval.csv").read_text().splitlines()[0].split(",")
    check("sources/a/loss" in header and "sources/b/accuracy" in header, f"eval.csv columns {header}")
    rows = (a / "csv/csv/eval.csv").read_text().splitlines()[1:]
    last = dict(zip(header, rows[-1].split(",")))
    check(abs(float(last["sources/b/loss"]) - src["b"]["loss"]) < 1e-6, "eval.csv holds b's loss")
    train_header = (a / "csv/csv/train.csv").read_text().splitlines()[0].split(",")
    check("source_passes/1" in train_header, "train.csv has source_passes/1")
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        acc = EventAccumulator(str(a / "tensorboard/tb"), size_guidance={"scalars": 0})
        acc.Reload()
        tags = acc.Tags()["scalars"]
        check("eval/sources/a/loss" in tags and "train/source_passes/1" in tags,
              "TensorBoard has eval/sources/a/loss and train/source_passes/1")
        passes = [e.value for e in acc.Scalars("train/source_passes/1")]
        check(passes[0] == 1 and passes[-1] == 2, "TensorBoard shows source b's wrap-around")
    except ImportError:
        print("tensorboard not installed: its part skipped")

    # `moe-train eval` of the step-40 checkpoint: the same per-source and overall figures as the
    # run's own step-40 eval record.
    r = run("eval", "--config", cfg_path, "--set", f"training.output_dir={a}",
            "--checkpoint", a / "checkpoints/step-00000040")
    check(r.returncode == 0, f"eval exit {r.returncode}: {r.stderr[-300:]}")
    e = json.loads(r.stdout) if r.returncode == 0 else {}
    check(sorted(e.get("sources", {})) == ["a", "b"], f"eval CLI sources {sorted(e.get('sources', {}))}")
    check(abs(e.get("loss", 0) - ev[-1]["loss"]) < 1e-6 and
          all(abs(e["sources"][n]["loss"] - src[n]["loss"]) < 1e-6 for n in src),
          f"eval CLI loss {e.get('loss')} = run's step-40 {ev[-1]['loss']}, per source too")

    # 4. Bad blends: one-line errors naming the key, non-zero exit, no output directory.
    def bad(blend, expect, extra=None):
        c = json.loads(json.dumps(cfg))
        c["data"]["blend"] = blend
        if extra:
            c["data"].update(extra)
        p = tmp / "bad.json"
        p.write_text(json.dumps(c))
        out = tmp / "bad-run"
        r = run("--config", p, "--set", f"training.output_dir={out}")
        line = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
        check(r.returncode != 0 and expect in line and not out.exists(),
              f"bad blend -> exit {r.returncode}: {line}")

    pa, pb = str(tmp / "a"), str(tmp / "b")
    bad([{"path": pa, "weight": 1}, {"path": pb, "weight": 0}], "data.blend[1].weight = 0")
    bad([{"path": pa, "wieght": 1}], "data.blend[0].wieght")
    bad([{"path": pa}, {"path": pa}], "data.blend[1].name")
    bad([{"path": pa}, {"path": str(tmp / "missing")}], "data.blend[1].path")
    bad([{"path": pa}], "data.blend", {"path": pb})
    bad({"path": pa}, "data.blend")

if FAILED:
    print(f"{len(FAILED)} check(s) failed")
    sys.exit(1)
