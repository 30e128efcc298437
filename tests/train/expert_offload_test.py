#!/usr/bin/env python3
"""The expert offload tier on the CPU path (moe.offload_experts, layers/offload_ring.h): the frozen
routed experts live in one packed host buffer per MoE layer and every GEMM reads them from a
ring of separate "device" buffers filled by copies, the same code path a GPU run takes (there
the buffers are on the device and the copies run on a side stream).

For a Qwen3-MoE-shaped model (a dense layer among the MoE layers, q/k norms) and a
DeepSeek-V3-shaped one (multi-head latent attention, a leading dense layer, a shared expert,
sigmoid group-limited routing), over a full-precision base (a CPU LoRA base is fp32; on a GPU it
is the 16-bit compute dtype, the same packing with another element size) and over a 4-bit
base (nf4 with double quant), LoRA r 4 on attention and experts:

  1. with the tier on, the per-step losses and the final adapters are bitwise those of the same
     run with it off; also with every block checkpointed and two micro-batches per step (the
     recomputation and the turn at either end of the ring);
  2. resume across the setting: 3 steps with it on, resumed with it off to 6 (and the other way
     round) gives bitwise the uninterrupted run's losses and adapters;
  3. the ring's own allocation counters (the log's "expert offload:" line): it never held more
     device bytes than its 2 slots of the largest layer, it copied and it found layers in a slot;
  4. `on` without LoRA, or a ring of one layer, is refused in one line naming the key, exit 2.

usage: expert_offload_test.py MOE_TRAIN_BINARY
"""
import json
import pathlib
import re
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from e2e import make_synthetic  # noqa: E402

BIN = sys.argv[1]
STEPS = 6

QWEN3 = {
    "model": {"vocab_size": 128, "seq_len": 32, "hidden_size": 32, "num_layers": 4, "num_heads": 4,
              "num_key_value_heads": 2, "qk_norm": True},
    "moe": {"num_experts": 8, "top_k": 2, "expert_hidden_size": 24, "mlp_only_layers": [1]},
    "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}
MLA = {
    "model": {"vocab_size": 128, "seq_len": 32, "hidden_size": 32, "num_layers": 4, "num_heads": 4,
              "kv_lora_rank": 16, "rope_theta": 10000.0, "q_lora_rank": 24, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
              "v_head_dim": 8, "dense_hidden_size": 48},
    "moe": {"num_experts": 8, "top_k": 2, "expert_hidden_size": 16, "mlp_only_layers": [0],
            "shared_expert_hidden_size": 16, "score_function": "sigmoid", "n_group": 4,
            "topk_group": 2, "routed_scaling_factor": 2.5},
    "targets": ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "gate_proj",
                "up_proj", "down_proj"],
}
FOUR_BIT = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
            "bnb_4bit_use_double_quant": True}


def config(tmp, shape, tag, offload, four_bit=False, checkpointing=False, resume_at=0):
    out = tmp / f"run-{tag}"
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2 if checkpointing else 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                   "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 2}},
        "gradient_clipping": 1.0,
        "lora": {"r": 4, "lora_alpha": 8, "target_modules": shape["targets"]},
        "model": dict(shape["model"]),
        "moe": {**shape["moe"], "offload_experts": "on" if offload else "off"},
        "data": {"train_path": str(tmp / "data/train.h5"), "valid_path": str(tmp / "data/valid.h5")},
        "training": {"device": "cpu", "output_dir": str(out), "train_iters": STEPS,
                     "eval_interval": 0, "eval_iters": 1, "seed": 7},
        "checkpoint": {"save_interval": resume_at or STEPS},
    }
    if checkpointing:
        cfg["activation_checkpointing"] = {"number_checkpoints": shape["model"]["num_layers"]}
    if four_bit:
        cfg["quantization"] = dict(FOUR_BIT)
    path = tmp / f"cfg-{tag}.json"
    path.write_text(json.dumps(cfg))
    return path, out


def train(cfg, *extra):
    r = subprocess.run([BIN, "train", "--config", cfg, *extra], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: train {cfg} {' '.join(extra)}: exit {r.returncode}\n{r.stderr[-3000:]}")
    return r.stdout + r.stderr


def losses(out):
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if r.get("type") == "train"]


def adapters(out, step=STEPS):
    return load_file(str(out / "checkpoints" / f"step-{step:08d}" / "model.safetensors"))


def same_run(a, b, what):
    la, lb = losses(a), losses(b)
    assert len(la) == STEPS and la == lb, f"{what}: losses differ:\n  {la}\n  {lb}"
    ta, tb = adapters(a), adapters(b)
    assert ta.keys() == tb.keys() and ta, f"{what}: different adapter names"
    for k in ta:
        assert torch.equal(ta[k], tb[k]), f"{what}: adapter {k} differs"
    lora_b = [k for k in ta if "lora_B" in k or "lora_b" in k]
    assert any(ta[k].abs().sum() > 0 for k in lora_b or ta), f"{what}: adapters never trained"
    print(f"  {what}: {STEPS} losses and {len(ta)} adapter tensors bitwise equal")


def check_ring_counters(log, what):
    m = re.search(r"expert offload: (\d+) MoE layers.*?: (\d+) fetches, (\d+) found in a slot, "
                  r"(\d+) copies \((\d+) ahead.*slot bytes at most (\d+) of a planned (\d+) \((\d+) x",
                  log)
    assert m, f"{what}: no expert offload summary in the log:\n{log[-2000:]}"
    layers, fetches, hits, copies, ahead, peak, planned, slots = map(int, m.groups())
    assert slots == 2 and 0 < peak <= planned, f"{what}: ring held {peak} of planned {planned}"
    assert copies > 0 and hits > 0 and ahead > 0 and fetches == hits + copies - ahead, \
        f"{what}: counters {m.group(0)}"
    print(f"  {what}: {layers} MoE layers, {fetches} fetches, {copies} copies ({ahead} ahead), "
          f"ring at most {peak} of {planned} bytes")


def pair(tmp, shape, tag, **kw):
    off_cfg, off = config(tmp, shape, f"{tag}-off", False, **kw)
    on_cfg, on = config(tmp, shape, f"{tag}-on", True, **kw)
    train(off_cfg)
    log = train(on_cfg)
    assert "expert offload: on" in log, f"{tag}: the tier did not say it was on"
    same_run(off, on, f"{tag}: offload on vs off")
    check_ring_counters(log, tag)
    return off


def resume_across(tmp, shape, tag, first_on, uninterrupted, **kw):
    a_cfg, out = config(tmp, shape, f"{tag}-resume", first_on, resume_at=3, **kw)
    b_cfg = tmp / f"cfg-{tag}-resume-b.json"
    cfg = json.loads(a_cfg.read_text())
    cfg["training"]["exit_interval"] = 3  # stops after step 3 (the schedule still spans 6)
    a_cfg.write_text(json.dumps(cfg))
    train(a_cfg)
    del cfg["training"]["exit_interval"]
    cfg["moe"]["offload_experts"] = "off" if first_on else "on"
    b_cfg.write_text(json.dumps(cfg))
    log = train(b_cfg)
    assert "resuming from step 3" in log, f"{tag}: did not resume:\n{log[-1500:]}"
    la = dict(losses(out))
    lu = dict(losses(uninterrupted))
    assert la == lu, f"{tag}: resumed losses differ:\n  {la}\n  {lu}"
    tu, ta = adapters(uninterrupted), adapters(out)
    for k in tu:
        assert torch.equal(tu[k], ta[k]), f"{tag}: adapter {k} differs after the resume"
    print(f"  {tag}: 3 steps {'on' if first_on else 'off'}, resumed "
          f"{'off' if first_on else 'on'} to {STEPS}: bitwise the uninterrupted run")


def refusals(tmp):
    cfg_path, _ = config(tmp, QWEN3, "refuse", True)
    cfg = json.loads(cfg_path.read_text())
    del cfg["lora"]
    cfg_path.write_text(json.dumps(cfg))
    r = subprocess.run([BIN, "train", "--config", cfg_path], capture_output=True, text=True)
    lines = [l for l in r.stderr.splitlines() if l.startswith("moe-train:")]
    assert r.returncode == 2 and len(lines) == 1 and "moe.offload_experts" in lines[0] \
        and "lora.r" in lines[0], f"no LoRA: exit {r.returncode}: {r.stderr[-800:]}"
    cfg_path, _ = config(tmp, QWEN3, "refuse2", True)
    cfg = json.loads(cfg_path.read_text())
    cfg["moe"]["offload_ring_layers"] = 1
    cfg_path.write_text(json.dumps(cfg))
    r = subprocess.run([BIN, "train", "--config", cfg_path], capture_output=True, text=True)
    lines = [l for l in r.stderr.splitlines() if l.startswith("moe-train:")]
    assert r.returncode == 2 and len(lines) == 1 and "moe.offload_ring_layers" in lines[0], \
        f"a ring of 1: exit {r.returncode}: {r.stderr[-800:]}"
    print("  refused in one line, exit 2: on without LoRA, a ring of 1 layer")


def main():
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        make_synthetic(BIN, tmp / "data", vocab=64, programs=3, doc_len=33, train_docs=300,
                       valid_docs=16)
        print("qwen3-moe-shaped:")
        q_full = pair(tmp, QWEN3, "qwen3-fp32")
        pair(tmp, QWEN3, "qwen3-fp32-checkpointed", checkpointing=True)
        q_4bit = pair(tmp, QWEN3, "qwen3-nf4", four_bit=True)
        resume_across(tmp, QWEN3, "qwen3-fp32", True, q_full)
        resume_across(tmp, QWEN3, "qwen3-nf4", False, q_4bit, four_bit=True)
        print("deepseek-v3-shaped (MLA):")
        m_full = pair(tmp, MLA, "mla-fp32")
        pair(tmp, MLA, "mla-nf4-checkpointed", four_bit=True, checkpointing=True)
        resume_across(tmp, MLA, "mla-fp32", True, m_full)
        refusals(tmp)
    print("PASS")


if __name__ == "__main__":
    main()
