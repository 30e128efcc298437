"""LoRA over a frozen base, with transformers + PEFT as the oracle (tiny random models built
locally from transformers' config classes; nothing is downloaded). For Mixtral, Qwen3-MoE (with
a dense layer) and OLMoE:

  import-hf; a LoRA run (r 4 on q/k/v/o and the experts' gate_proj + up_proj + down_proj, as
  PEFT reads those names under transformers >= 5) from the imported weights; its step-0 adapter
  exported with `export-hf --adapter` and loaded by peft.PeftModel.from_pretrained onto the
  transformers model (float64); 20 AdamW steps there on the same batches with the same learning
  rates and clipping: per-step losses within 1e-5 relative, final adapter tensors within 1e-5;
  `export-hf --merge` loads in transformers with no missing/unexpected keys and its logits match
  `moe-train eval --dump-logits` within 1e-4, and so do the PEFT adapter's through PeftModel;
  import-hf --adapter of that adapter equals the merged export.

Then, on Qwen3-MoE: the run's base stays bitwise unchanged (the trainer re-hashes it at the end),
checkpoints hold the adapters only, 20 + 20 steps with a resume are bitwise equal to 40 straight,
activation checkpointing of every block gives the same losses, capacity routing trains, and
resuming on a different base exits 2 naming it.

Also: `plan` says Qwen3-30B-A3B and Mixtral-8x7B (published configs, configs/published) fit one
141 GiB GPU with configs/finetune-lora.json; so do DeepSeek-V2-Lite and Moonlight-16B-A3B with
their latent-attention targets, while DeepSeek-V3 does not and the plan names its two nearest
options; the config's k_proj / v_proj on an MLA model exit 2 naming lora.target_modules.

With family names (e.g. qwen3_next qwen3_5_moe_text, the Gated DeltaNet hybrids: adapters on
the attention layers' q/k/v/o, the linear-attention layers' input projections (fused or split)
and out_proj, the shared expert's gate and the routed experts;
deepseek_v3 deepseek_v2, the latent-attention families: adapters on
q_a_proj / q_b_proj or q_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj and the routed experts;
glm4_moe, GLM-4.5 with q/k/v biases, q/k norms, partial rotary and group routing; gemma4_text,
Gemma 4 with its experts beside a dense MLP (PEFT's target_parameters experts.gate_up_proj /
experts.down_proj) and no v_proj on its K = V layer; nemotron_h, Nemotron-H with adapters on its
attention, Mamba in_proj and relu2 experts' up / down; granitemoehybrid, Granite 4.0-H with
adapters on its attention, Mamba in_proj and fused experts), only those families' checks run.

usage: lora_test.py MOE_TRAIN_BINARY [FAMILY...]
"""
import json
import math
import pathlib
import sys
import tempfile

import peft
import torch
import transformers
from safetensors.torch import load_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "hf"))
from tiny_families import (COMMON, FAMILIES, GEMMA4_FAMILIES, GEMMA4_LORA,  # noqa: E402
                           GLM_FAMILIES, HYBRID, HYBRID_FAMILIES, MAMBA_FAMILIES, MISTRAL4_FAMILIES,
                           MLA_FAMILIES, SIGMOID_FAMILIES, SOFTMAX_BIAS_FAMILIES)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from lora_common import checkpoint, peft_steps, runner  # noqa: E402

BIN = sys.argv[1]
ONLY = sys.argv[2:]
STEPS, BATCH, SEQ = 20, 8, 32
LOSS_RTOL, TENSOR_TOL, LOGITS_TOL = 1e-5, 1e-5, 1e-4
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Latent attention's projections (DeepSeek-V3 with a query bottleneck; V2 with one q_proj) and
# the experts; PEFT maps gate/up/down_proj to the routed experts only (not the shared ones).
MLA_TARGETS = {"deepseek_v3": ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
                               "gate_proj", "up_proj", "down_proj"],
               "deepseek_v2": ["q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "gate_proj",
                               "up_proj", "down_proj"]}
MLA_TARGETS["glm4_moe_lite"] = MLA_TARGETS["mistral4"] = MLA_TARGETS["deepseek_v3"]
# Nemotron-H: attention, the Mamba layers' in_proj (PEFT refuses out_proj on Mamba models), the
# relu2 experts' up and down (PEFT: target_parameters mixer.experts.up_proj / down_proj).
MLA_TARGETS["nemotron_h"] = ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj", "up_proj",
                             "down_proj"]
# Granite 4.0-H: attention, the Mamba layers' in_proj (under mamba.) and the fused experts
# (PEFT: target_parameters block_sparse_moe.experts.gate_up_proj / down_proj).
MLA_TARGETS["granitemoehybrid"] = ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj", "gate_proj",
                                   "up_proj", "down_proj"]
# The Gated DeltaNet hybrids: attention, the linear-attention layers' projections (Qwen3-Next
# fused, Qwen3.5 split) and out_proj, the shared expert's gate and the routed experts.
MLA_TARGETS["qwen3_next"] = TARGETS + ["in_proj_qkvz", "in_proj_ba", "out_proj", "shared_expert_gate"]
MLA_TARGETS["qwen3_5_moe_text"] = TARGETS + ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a",
                                             "out_proj", "shared_expert_gate"]

run = runner(BIN)


def config(tmp, tag, base, out, targets=TARGETS, **training):
    cfg = {
        "train_micro_batch_size_per_gpu": BATCH,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                   "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 3}},
        "gradient_clipping": 1.0,
        "lora": {"r": 4, "lora_alpha": 8, "target_modules": targets},
        "model": {"seq_len": SEQ, "init_from": str(base)},
        # the routers are frozen; their losses would still reach the adapters through the
        # hidden states, and transformers' aux loss is another formula: compare without them
        "moe": {"aux_loss_coeff": 0.0, "z_loss_coeff": 0.0},
        "data": {"train_path": str(tmp / "data/train.h5"), "valid_path": str(tmp / "data/valid.h5"),
                 "shuffle": False},
        "training": {"device": "cpu", "output_dir": str(out), "train_iters": STEPS,
                     "eval_interval": 0, "eval_iters": 2, **training},
        "checkpoint": {"save_initial": True},
    }
    path = tmp / f"cfg-{tag}.json"
    path.write_text(json.dumps(cfg))
    return path


def peft_model(base_dir, adapter_dir, trainable, dtype=torch.float32):
    # eager experts: transformers' grouped-GEMM path takes no float64
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=dtype,
                                                             experts_implementation="eager")
    return peft.PeftModel.from_pretrained(base, adapter_dir, is_trainable=trainable)


def peft_training(tmp, src, adapter0, ours):
    """20 steps of the PEFT peer on the batches moe-train read (unshuffled windows), in float64:
    the exact answer that moe-train's float32 run is held to (a float32 peer differs from it by
    its own rounding, up to ~1e-5 on the adapters after 20 Adam steps)."""
    m = peft_model(src, adapter0, trainable=True, dtype=torch.float64)
    return peft_steps(m, tmp / "data/train.h5", ours, STEPS, BATCH, SEQ, LOSS_RTOL, fused=True)


def logits_of(model, tokens):
    with torch.no_grad():
        return model.eval()(input_ids=tokens).logits


def family_test(tmp, family):
    cls, extra = {**FAMILIES, **MLA_FAMILIES, **GLM_FAMILIES, **HYBRID_FAMILIES, **SIGMOID_FAMILIES,
                  **SOFTMAX_BIAS_FAMILIES, **MISTRAL4_FAMILIES, **GEMMA4_FAMILIES,
                  **MAMBA_FAMILIES}[family]
    # Gemma 4's and Nemotron-H's dicts are whole (their widths and layers differ from COMMON's)
    whole = family in GEMMA4_FAMILIES or family in MAMBA_FAMILIES
    common = HYBRID if family in HYBRID_FAMILIES else {} if whole else COMMON
    print(f"{family}:")
    torch.manual_seed(11)
    src = tmp / f"hf-{family}"
    shape = GEMMA4_LORA if family in GEMMA4_FAMILIES else {}  # tiny_families.py says why
    transformers.AutoModelForCausalLM.from_config(cls(**{**common, **extra, **shape})).save_pretrained(src)
    base = tmp / f"base-{family}"
    run("import-hf", src, "--out", base)
    out = tmp / f"run-{family}"
    cfg = config(tmp, family, base, out, MLA_TARGETS.get(family, TARGETS))
    run("--config", cfg, "-q")
    ours = [json.loads(l) for l in open(out / "metrics.jsonl")]
    ours = [m for m in ours if m["type"] == "train"]
    assert len(ours) == STEPS

    adapter0 = tmp / f"adapter0-{family}"
    run("export-hf", checkpoint(out, 0), "--adapter", "--out", adapter0)
    theirs = peft_training(tmp, src, adapter0, ours)

    adapter = tmp / f"adapter-{family}"
    run("export-hf", checkpoint(out, STEPS), "--adapter", "--out", adapter)
    mine = load_file(adapter / "adapter_model.safetensors")
    assert mine.keys() == theirs.keys(), f"adapter names: {sorted(mine)[:4]} vs {sorted(theirs)[:4]}"
    worst = max((mine[k].double() - theirs[k].detach()).abs().max().item() for k in mine)
    print(f"  final adapter: {len(mine)} tensors, max |diff| vs PEFT {worst:.1e}")
    bar = TENSOR_TOL
    if worst > TENSOR_TOL:
        # float32 training cannot be closer to the float64 peer than float32 rounding allows
        # (Adam divides near-zero gradients, such as an expert's lora_A's while its lora_B is
        # still small, by their own size). Where we pass 1e-5, transformers + PEFT's own float32
        # training on the same batches says how far float32 lands; ours is held to that
        # (x 1.25: two float32 runs each land about that far, neither nearer by rule), as
        # hf_parity.full_fine_tuning_peer holds full fine-tuning's weights. Gemma 4: PEFT's own
        # float32 1.9e-5, ours 1.94e-5 (2026-12-07).
        peer32 = peft_model(src, adapter0, trainable=True, dtype=torch.float32)
        theirs32 = peft_steps(peer32, tmp / "data/train.h5", ours, STEPS, BATCH, SEQ, math.inf,
                              fused=True)
        noise = max((theirs32[k].double() - theirs[k].detach()).abs().max().item() for k in mine)
        bar = max(TENSOR_TOL, 1.25 * noise)
        print(f"  transformers + PEFT's own float32 training: {noise:.1e} from the float64 peer")
    assert worst <= bar, f"adapter tensors differ from PEFT's by {worst} (bar {bar:.1e})"

    dump = tmp / f"logits-{family}.safetensors"
    r = json.loads(run("eval", "--config", cfg, "--checkpoint", checkpoint(out, STEPS),
                       "--dump-logits", dump).stdout)
    d = load_file(dump)
    tokens, our_logits = d["tokens"][:, :-1], d["logits"]

    # The adapters come with the checkpoint: a config without a lora section (and without the
    # base it was trained from) evaluates them as the run that wrote them did.
    plain = json.loads(pathlib.Path(cfg).read_text())
    plain.pop("lora")
    plain["model"].pop("init_from")
    plain_cfg = tmp / f"cfg-plain-{family}.json"
    plain_cfg.write_text(json.dumps(plain))
    r_plain = json.loads(run("eval", "--config", plain_cfg, "--checkpoint", checkpoint(out, STEPS)).stdout)
    assert r_plain["loss"] == r["loss"], (r_plain["loss"], r["loss"])
    print(f"  eval with a config without a lora section: loss {r_plain['loss']:.5f}, the same")
    merged = tmp / f"merged-{family}"
    run("export-hf", checkpoint(out, STEPS), "--merge", "--out", merged)
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32,
                                                                 output_loading_info=True)
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        assert not info[k], f"{family}: merged export: transformers reports {k}: {info[k]}"
    diff_merged = (logits_of(hf, tokens) - our_logits).abs().max().item()
    diff_peft = (logits_of(peft_model(src, adapter, False), tokens) - our_logits).abs().max().item()
    print(f"  logits vs moe-train eval (loss {r['loss']:.5f}): merged export {diff_merged:.1e}, "
          f"PEFT adapter {diff_peft:.1e}")
    assert diff_merged <= LOGITS_TOL and diff_peft <= LOGITS_TOL

    again = tmp / f"readapted-{family}"
    run("import-hf", src, "--adapter", adapter, "--out", again)
    merged_ck = tmp / f"merged-ck-{family}"
    run("import-hf", merged, "--out", merged_ck)
    a, b = load_file(again / "model.safetensors"), load_file(merged_ck / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), \
        "import-hf --adapter equals the merged export"
    return base, out


def frozen_resume_and_base(tmp, base, straight):
    print("qwen3_moe: frozen base, adapters-only checkpoints, resume, another base:")
    log = (straight / "train.log")
    held = load_file(checkpoint(straight, STEPS) / "model.safetensors")
    assert all(".lora_" in k for k in held), f"checkpoint holds base tensors: {sorted(held)[:3]}"
    state = json.loads((checkpoint(straight, STEPS) / "state.json").read_text())
    state0 = json.loads((checkpoint(straight, 0) / "state.json").read_text())
    assert state["lora_base_fingerprint"] == state0["lora_base_fingerprint"]

    # 40 straight vs 20 + 20 (exit_interval stops after step 20; the same command resumes).
    full, split = tmp / "run-40", tmp / "run-20-20"
    r = run("--config", config(tmp, "40", base, full, train_iters=40))
    assert "base weights unchanged" in r.stderr, "the trainer re-checks the frozen base"
    cfg = config(tmp, "20-20", base, split, train_iters=40, exit_interval=20)
    run("--config", cfg, "-q")
    assert not checkpoint(split, 40).exists()
    run("--config", cfg, "-q")
    for f in ("model.safetensors", "optimizer.safetensors"):
        a, b = load_file(checkpoint(full, 40) / f), load_file(checkpoint(split, 40) / f)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f"{f} differs"
    print("  40 steps straight == 20 + 20 resumed, bitwise (adapters and Adam state)")

    # Activation checkpointing: the frozen embedding's output gets a gradient so the recomputed
    # blocks reach their adapters; the same losses as without it. Capacity routing trains too.
    straight_losses = [json.loads(l)["loss"] for l in open(straight / "metrics.jsonl")
                       if json.loads(l)["type"] == "train"]
    ckpt = tmp / "run-checkpointed"
    run("--config", config(tmp, "ckpt", base, ckpt, **{}), "-q", "--set",
        "activation_checkpointing.number_checkpoints=3")
    ckpt_losses = [json.loads(l)["loss"] for l in open(ckpt / "metrics.jsonl")
                   if json.loads(l)["type"] == "train"]
    w = max(abs(a - b) / abs(b) for a, b in zip(ckpt_losses, straight_losses))
    assert w <= 1e-6, f"activation checkpointing changes the LoRA run by {w}"
    cap = tmp / "run-capacity"
    run("--config", config(tmp, "cap", base, cap), "-q", "--set", "moe.capacity_factor=1.0")
    cap_losses = [json.loads(l)["loss"] for l in open(cap / "metrics.jsonl")
                  if json.loads(l)["type"] == "train"]
    assert cap_losses[-1] < cap_losses[0] - 0.05, cap_losses
    print(f"  activation checkpointing: losses within {w:.1e} of the plain run; capacity factor 1: "
          f"loss {cap_losses[0]:.3f} -> {cap_losses[-1]:.3f}")

    # Another base under the same output_dir: exit 2 naming both.
    torch.manual_seed(99)
    cls, extra = FAMILIES["qwen3_moe"]
    other_src = tmp / "hf-other"
    transformers.AutoModelForCausalLM.from_config(cls(**COMMON, **extra)).save_pretrained(other_src)
    other = tmp / "base-other"
    run("import-hf", other_src, "--out", other)
    cfg2 = config(tmp, "other", other, split, train_iters=60)
    r = run("--config", cfg2, ok=False)
    assert r.returncode == 2, f"exit {r.returncode}: {r.stderr[-800:]}"
    assert "different base model" in r.stderr and str(other) in r.stderr and str(base) in r.stderr, \
        r.stderr[-800:]
    print(f"  another base: exit 2: {r.stderr.strip().splitlines()[-1][:160]}...")


def published_models_fit():
    """configs/finetune-lora.json (r 16 on attention and experts, bf16 base, 2048 tokens, every
    block checkpointed) on the published Qwen3-30B-A3B and Mixtral-8x7B architectures: the plan
    says they fit one 141 GiB GPU."""
    root = pathlib.Path(__file__).resolve().parents[2]
    for name in ("Qwen3-30B-A3B", "Mixtral-8x7B-v0.1"):
        r = run("plan", "--config", root / "configs/finetune-lora.json", "--set",
                f"model.init_from={root / 'configs/published' / name}", "--gpu-memory", "141GiB", "--json")
        p = json.loads(r.stdout)
        assert p["fits"] and p["parameters"] > 3e10, p
        print(f"{name}: {p['parameters'] / 1e9:.1f} B parameters, LoRA r 16: plan "
              f"{p['reserved_bytes'] / 2**30:.1f} GiB reserved on 141 GiB, largest micro-batch "
              f"{p['max_micro_batch']}")
    # The DeepSeek lineage in its own attention names: the 16 B ones fit, V3 does not and the plan
    # says how far its nearest options are; the config's k_proj / v_proj are refused on MLA.
    experts = ["gate_proj", "up_proj", "down_proj"]
    mla = {"DeepSeek-V2-Lite": ["q_proj"], "Moonlight-16B-A3B": ["q_proj"],
           "DeepSeek-V3": ["q_a_proj", "q_b_proj"]}
    for name, query in mla.items():
        targets = json.dumps(query + ["kv_a_proj_with_mqa", "kv_b_proj", "o_proj"] + experts)
        base = ["plan", "--config", root / "configs/finetune-lora.json", "--set",
                f"model.init_from={root / 'configs/published' / name}", "--gpu-memory", "141GiB"]
        p = json.loads(run(*base, "--set", f"lora.target_modules={targets}", "--json").stdout)
        if name == "DeepSeek-V3":
            assert not p["fits"] and p["parameters"] > 6.7e11 and len(p["nearest"]) == 2, p
            assert "4-bit base" in p["nearest"][0] and "256 GPUs" in p["nearest"][1], p["nearest"]
        else:
            assert p["fits"] and 1.5e10 < p["parameters"] < 1.7e10, p
        print(f"{name}: {p['parameters'] / 1e9:.1f} B parameters, LoRA r 16 on MLA + experts: plan "
              f"{p['reserved_bytes'] / 2**30:.1f} GiB reserved on 141 GiB; fits: {p['fits']}")
        r = run(*base, ok=False)
        assert r.returncode == 2 and "lora.target_modules" in r.stderr, r.stderr[-600:]


if not ONLY:
    published_models_fit()
with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    run("make-synthetic", "--out", tmp / "data", "--vocab", "320", "--programs", "4", "--doc-len",
        str(SEQ + 1), "--train-docs", "400", "--valid-docs", "32")
    runs = {}
    for family in ONLY or FAMILIES:
        runs[family] = family_test(tmp, family)
    if "qwen3_moe" in runs:
        frozen_resume_and_base(tmp, *runs["qwen3_moe"])
    print("ok")
