"""DeepSpeed's flops_profiler block: a run writes the per-module table at profile_step (log and
output_file); the experts' and attention's FLOPs match the documented formula
(docs/monitoring.md); the parameters add up to the model's; other steps are not profiled.

usage: flops_profiler_test.py MOE_TRAIN_BINARY
"""
import json
import pathlib
import subprocess
import sys
import tempfile

BIN = sys.argv[1]


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        sys.exit(1)


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    r = subprocess.run([BIN, "make-synthetic", "--out", tmp / "data", "--vocab", "64", "--programs", "4",
                        "--doc-len", "33", "--train-docs", "256", "--valid-docs", "32"], capture_output=True, text=True)
    check(r.returncode == 0, "make-synthetic")
    B, S, d, L, V, E, k, f, H, KV, hd = 8, 32, 32, 2, 128, 4, 2, 64, 4, 2, 16
    cfg = {
        "train_batch_size": B, "train_micro_batch_size_per_gpu": 4,
        "model": {"vocab_size": V, "seq_len": S, "hidden_size": d, "num_layers": L, "num_heads": H,
                  "num_key_value_heads": KV, "head_dim": hd, "rope_theta": 10000},
        "moe": {"num_experts": E, "top_k": k, "expert_hidden_size": f},
        "data": {"train_path": str(tmp / "data/train.h5"), "valid_path": str(tmp / "data/valid.h5")},
        "training": {"output_dir": str(tmp / "run"), "train_iters": 4, "eval_iters": 1},
        "flops_profiler": {"enabled": True, "profile_step": 2, "module_depth": -1, "top_modules": 3,
                           "detailed": True, "output_file": str(tmp / "flops.txt")},
    }
    (tmp / "cfg.json").write_text(json.dumps(cfg))
    r = subprocess.run([BIN, "--config", tmp / "cfg.json"], capture_output=True, text=True)
    check(r.returncode == 0, f"training with the profiler (exit {r.returncode}) {r.stderr[-500:]}")
    check("flops_profiler" not in r.stderr or "no effect" not in r.stderr, "no 'no effect' warning")
    table = (tmp / "flops.txt").read_text()
    check(table.startswith("flops profiler: step 2,"), "the table is of step 2")
    check(r.stderr.count("flops profiler: step") == 1, "exactly one profiled step in the log")
    rows = {}
    for line in table.splitlines()[2:]:
        parts = line.split()
        if len(parts) == 5 and parts[0] in ("embedding", "attention", "router", "dispatch", "experts",
                                            "combine", "head", "optimizer", "total"):
            rows[parts[0]] = parts
    for m in ("embedding", "attention", "router", "dispatch", "experts", "combine", "head", "optimizer", "total"):
        check(m in rows, f"row {m}")
    tokens = B * S
    # The documented formula: forward FLOPs per token, x 3 for forward + backward, x layers, x tokens.
    attn_w = d * (H + 2 * KV) * hd + H * hd * d
    attention = 3 * (2 * attn_w + 4 * S * H * hd) * L * tokens
    experts = 3 * (k * 6 * d * f) * L * tokens
    for name, want in (("attention", attention), ("experts", experts)):
        got = float(rows[name][2])
        check(abs(got - want) <= 1e-6 * want, f"{name} FLOPs {got:.6e} == formula {want:.6e}")
    params = sum(int(rows[m][1]) for m in ("embedding", "attention", "router", "dispatch", "experts", "combine", "head"))
    total = int(rows["total"][1])
    check(params == total, f"module parameters add up to the total ({params})")
    check(f"model: {total} parameters" in r.stderr, f"total = the model's parameter count ({total})")
    # ... which is what the model really holds: the tensors of its checkpoint.
    ckpt = sorted((tmp / "run/checkpoints").glob("step-*"))[-1]
    info = subprocess.run([BIN, "checkpoint", "info", ckpt], capture_output=True, text=True)
    check(info.returncode == 0, "checkpoint info")
    doc = json.loads(info.stdout)
    tensors = doc["model"] if isinstance(doc, dict) and "model" in doc else doc
    numel = 0
    for t in (tensors.values() if isinstance(tensors, dict) else tensors):
        n = 1
        for x in t["shape"]:
            n *= x
        numel += n
    check(numel == total, f"the checkpoint's model tensors hold {numel} = {total} parameters")
    latencies = [float(rows[m][3]) for m in ("attention", "experts", "head")]
    check(all(x > 0 for x in latencies), f"measured forward latencies > 0 ms: {latencies}")
    check("attention.1" in table and "experts.0" in table, "per-layer rows (detailed)")
    metrics = [json.loads(l) for l in (tmp / "run/metrics.jsonl").read_text().splitlines()]
    check(len([m for m in metrics if m["type"] == "train"]) == 4, "training went on to step 4")
print("ok")
