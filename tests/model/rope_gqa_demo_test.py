"""A RoPE + grouped-query configuration of our own trains on the demo's data (scripts/demo:
configs/tiny.json) to the demo's accuracy bar (>= 0.90 next-token accuracy on validation).

usage: rope_gqa_demo_test.py MOE_TRAIN_BINARY SOURCE_DIR
"""
import json
import pathlib
import subprocess
import sys
import tempfile

BIN, SRC = sys.argv[1], pathlib.Path(sys.argv[2])

with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    r = subprocess.run([BIN, "make-synthetic", "--out", tmp / "data", "--vocab", "64", "--programs", "4",
                        "--doc-len", "65", "--train-docs", "4000", "--valid-docs", "256"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    sets = {"model.rope_theta": "10000", "model.num_key_value_heads": "2", "model.qk_norm": "true",
            "data.train_path": tmp / "data/train.h5", "data.valid_path": tmp / "data/valid.h5",
            "training.output_dir": tmp / "run"}
    args = [BIN, "--config", SRC / "configs/tiny.json", "-q"]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    evals = [json.loads(l) for l in (tmp / "run/metrics.jsonl").read_text().splitlines()]
    evals = [m for m in evals if m["type"] == "eval"]
    acc = evals[-1]["accuracy"]
    print(f"rope+gqa (4 query heads on 2 key/value heads, q/k norm): step {evals[-1]['step']} "
          f"validation accuracy {acc:.4f}, loss {evals[-1]['loss']:.4f} (step 0: {evals[0]['loss']:.4f})")
    assert acc >= 0.90, f"accuracy {acc} below the demo's bar 0.90"
    from_config = json.loads((tmp / "run/config.json").read_text())["model"]
    assert from_config["rope_theta"] == 10000 and from_config["num_key_value_heads"] == 2
print("ok")
