"""FP8 blockwise sources (issue 48): a checkpoint whose linear weights are float8_e4m3fn with
`weight_scale_inv` per block (config.json quantization_config quant_method "fp8",
weight_block_size), as DeepSeek-V3 / Kimi-K2 / Moonlight and the -FP8 releases of Qwen3-MoE and
GLM-4.5 ship, imports into weights bitwise equal to transformers' own dequantization
(`_dequantize_fp8_weight` in integrations/finegrained_fp8.py, block size from the config, fp32):
the test writes the FP8 source from a tiny random model, and the same model with every FP8 matrix
replaced by that function's output as a plain fp32 source; the two imports must be identical,
tensor for tensor. Blocks that do not divide the matrices (partial edge blocks on the ceil grid),
fp32 and bf16 scales, per-tensor scales (weight_block_size null), DeepSeek-V3's latent-attention
layout (kv_a_proj_with_mqa's rows ending in a partial block), eval against transformers on the
dequantized model, and damaged sources (a missing or misshapen scale, FP8 without a
quantization_config, an unknown activation_scheme: exit 2 naming the file).
Mistral Small 4's release scheme: weight_block_size null with static activation scales (each
linear's one weight_scale_inv and its activation_scale; the fused experts' per-expert scales,
[E, 2, 1] for gate_up's two halves, [E, 1, 1] for down, and their [E] activation scales): imported
bitwise equal to transformers' Fp8Dequantize (what from_pretrained(dequantize=True) applies), the
activation scales dropped.
usage: fp8_import_test.py MOE_TRAIN_BINARY"""
import json
import pathlib
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers.integrations.finegrained_fp8 import Fp8Dequantize, _dequantize_fp8_weight

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import hf_parity  # noqa: E402
from tiny_families import COMMON, FAMILIES, MISTRAL4_FAMILIES, MLA_FAMILIES  # noqa: E402
from lora_common import runner  # noqa: E402 (on the path hf_parity sets)

BIN = sys.argv[1]
run = runner(BIN)
E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max


def quantize(w, block, scale_dtype):
    """w [rows, cols] -> (e4m3 weight, scale_inv) with one scale per block (or per tensor)."""
    w = w.float()
    if block is None:
        s = (w.abs().amax() / E4M3_MAX).clamp_min(1e-12).to(scale_dtype)
        return (w / s.float()).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), s.reshape(())
    br, bc = block
    rows, cols = w.shape
    gr, gc = -(-rows // br), -(-cols // bc)
    s = torch.empty(gr, gc)
    for i in range(gr):
        for j in range(gc):
            s[i, j] = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc].abs().amax() / E4M3_MAX
    s = s.clamp_min(1e-12).to(scale_dtype)
    full = s.float().repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols]
    return (w / full).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), s


def fp8_sources(tmp, family, block, scale_dtype):
    """The FP8 source, and the same model with transformers' dequantization as a fp32 source."""
    cls, extra = {**FAMILIES, **MLA_FAMILIES}[family]
    torch.manual_seed(3)
    model = transformers.AutoModelForCausalLM.from_config(cls(**{**COMMON, **extra})).eval()
    plain = tmp / f"{family}-plain"
    model.save_pretrained(plain)
    tensors = load_file(plain / "model.safetensors")
    fp8, ref = {}, {}
    quantized = 0
    for name, t in tensors.items():
        # As the released FP8 checkpoints: every linear projection; not embeddings, norms,
        # routers or the head (their modules_to_not_convert).
        if t.dim() == 2 and name.endswith(("_proj.weight", ".w1.weight", ".w2.weight", ".w3.weight",
                                           "kv_a_proj_with_mqa.weight")):
            q, s = quantize(t, block, scale_dtype)
            fp8[name], fp8[name + "_scale_inv"] = q, s
            ref[name] = _dequantize_fp8_weight(q, s, list(block) if block else None, torch.float32)
            quantized += 1
        else:
            fp8[name] = ref[name] = t
    assert quantized > 10, f"{family}: only {quantized} matrices quantized"
    src = tmp / f"{family}-fp8"
    src.mkdir()
    save_file(fp8, src / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((plain / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                     "weight_block_size": list(block) if block else None,
                                     "modules_to_not_convert": ["lm_head"]}
    (src / "config.json").write_text(json.dumps(config))
    dequantized = tmp / f"{family}-dequantized"
    dequantized.mkdir()
    save_file(ref, dequantized / "model.safetensors", metadata={"format": "pt"})
    (dequantized / "config.json").write_text((plain / "config.json").read_text())
    return src, dequantized, quantized


def mistral4_release_sources(tmp):
    """Mistral Small 4's FP8 release scheme (per-tensor, static), and transformers' dequantization
    of it as a fp32 source."""
    cls, extra = MISTRAL4_FAMILIES["mistral4"]
    torch.manual_seed(4)
    model = transformers.AutoModelForCausalLM.from_config(cls(**{**COMMON, **extra})).eval()
    plain = tmp / "mistral4-plain"
    model.save_pretrained(plain)
    dequantize = Fp8Dequantize(None)._dequantize_one
    fp8, ref, stacked, linear = {}, {}, 0, 0
    for name, t in load_file(plain / "model.safetensors").items():
        if t.dim() == 3 and name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            experts, rows, cols = t.shape
            halves = 2 if name.endswith("gate_up_proj") else 1  # gate and up scaled apart
            parts = t.float().reshape(experts, halves, rows // halves, cols)
            s = (parts.abs().amax(dim=(2, 3)) / E4M3_MAX).clamp_min(1e-12).reshape(experts, halves, 1)
            q = (parts / s.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
            q = q.reshape(experts, rows, cols)
            fp8[name], fp8[name + "_scale_inv"] = q, s
            fp8[name + "_activation_scale"] = torch.rand(experts) + 0.5
            ref[name] = dequantize(q, s, torch.float32)
            stacked += 1
        elif t.dim() == 2 and name.endswith(("_proj.weight", "kv_a_proj_with_mqa.weight")):
            q, s = quantize(t, None, torch.float32)
            fp8[name], fp8[name + "_scale_inv"] = q, s
            fp8[name.removesuffix("weight") + "activation_scale"] = torch.tensor(0.75)
            ref[name] = dequantize(q, s, torch.float32)
            linear += 1
        else:
            fp8[name] = ref[name] = t
    assert stacked >= 2 and linear > 5, f"mistral4: {stacked} stacked, {linear} linear FP8 tensors"
    config = json.loads((plain / "config.json").read_text())
    src, dequantized = tmp / "mistral4-fp8", tmp / "mistral4-dequantized"
    for d, tensors in ((src, fp8), (dequantized, ref)):
        d.mkdir()
        save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    (dequantized / "config.json").write_text(json.dumps(config))
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "static", "dequantize": False,
                                     "weight_block_size": None,
                                     "modules_to_not_convert": ["lm_head", "model.vision_tower",
                                                                "model.multi_modal_projector"]}
    (src / "config.json").write_text(json.dumps(config))
    return src, dequantized, stacked + linear


def compare_imports(what, src, dequantized, a, b, n):
    run("import-hf", src, "--out", a)
    run("import-hf", dequantized, "--out", b)
    ours, theirs = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert ours.keys() == theirs.keys(), f"{what}: {ours.keys() ^ theirs.keys()}"
    differ = [k for k in ours if not torch.equal(ours[k], theirs[k])]
    assert not differ, f"{what}: not bitwise transformers' dequantization: {differ[:5]}"
    print(f"ok   {what}: {n} FP8 tensors, {len(ours)} tensors imported bitwise equal to "
          f"transformers' dequantization (float32)")


def case(tmp, family, block, scale_dtype):
    what = f"{family}, blocks {block}, {str(scale_dtype).split('.')[-1]} scales"
    src, dequantized, n = fp8_sources(tmp, family, block, scale_dtype)
    a, b = tmp / f"{family}-imported-fp8", tmp / f"{family}-imported-ref"
    compare_imports(what, src, dequantized, a, b, n)
    return src, dequantized, a


def refused(tmp, src, tag, change, words):
    hf_parity.refused(BIN, tmp, src, tag, change, words)


edit_tensors, edit_config = hf_parity.edit_tensors, hf_parity.edit_config


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    src, dequantized, imported = case(tmp, "qwen3_moe", (24, 40), torch.float32)
    (tmp / "mixtral").mkdir()
    case(tmp / "mixtral", "mixtral", (16, 16), torch.bfloat16)
    (tmp / "tensor").mkdir()
    case(tmp / "tensor", "mixtral", None, torch.float32)

    # The imported FP8 model gives transformers' loss on the dequantized one.
    run("make-synthetic", "--out", tmp / "data", "--vocab", "320", "--programs", "4", "--doc-len", "33",
        "--train-docs", "200", "--valid-docs", "64")
    cfg = tmp / "eval.json"
    cfg.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 4,
        "data": {"train_path": str(tmp / "data/train.h5"), "valid_path": str(tmp / "data/valid.h5")},
        "model": {"seq_len": 32}, "training": {"eval_iters": 4, "device": "cpu", "output_dir": str(tmp / "run")}}))
    dump = tmp / "logits.safetensors"
    r = json.loads(run("eval", "--config", cfg, "--checkpoint", imported, "--dump-logits", dump).stdout)
    hf_parity.compare("qwen3_moe FP8 import vs transformers on the dequantized model", dump, dequantized,
                      r["loss"], 1e-5, 1e-6)
    # DeepSeek-V3's layout (latent attention, shared expert, dense first layer) in 16 x 16 blocks:
    # kv_a_proj_with_mqa's 24 rows (kv_lora_rank 16 + rotary 8) end in a partial block, as V3's
    # 576 rows do in its 128 x 128 ones.
    (tmp / "v3").mkdir()
    _, v3_dequantized, v3_imported = case(tmp / "v3", "deepseek_v3", (16, 16), torch.float32)
    r = json.loads(run("eval", "--config", cfg, "--checkpoint", v3_imported, "--dump-logits",
                       tmp / "v3-logits.safetensors").stdout)
    hf_parity.compare("deepseek_v3 FP8 import vs transformers on the dequantized model",
                      tmp / "v3-logits.safetensors", v3_dequantized, r["loss"], 1e-5, 1e-6)

    q = "model.layers.0.self_attn.q_proj.weight"
    refused(tmp, src, "missing-scale", edit_tensors(lambda t: t.pop(q + "_scale_inv")),
            [q, "_scale_inv", "model.safetensors"])
    refused(tmp, src, "scale-shape", edit_tensors(lambda t: t.update({q + "_scale_inv": torch.ones(2, 2)})),
            [q + "_scale_inv", "[3, 2]", "24 x 40"])
    refused(tmp, src, "no-quantization-config", edit_config(lambda c: c.pop("quantization_config")),
            [q, "F8_E4M3", "quantization_config"])
    refused(tmp, src, "unknown-activation-scheme",
            edit_config(lambda c: c["quantization_config"].update(activation_scheme="per_token")),
            ["config.json", "activation_scheme", "per_token"])

    # Mistral Small 4's release scheme: per-tensor and per-expert scales, static input scales.
    (tmp / "m4").mkdir()
    m4_src, m4_dequantized, n = mistral4_release_sources(tmp / "m4")
    compare_imports("mistral4, per-tensor and per-expert scales, static activation scales", m4_src,
                    m4_dequantized, tmp / "m4/imported-fp8", tmp / "m4/imported-ref", n)
    gate_up = "model.layers.1.mlp.experts.gate_up_proj"
    refused(tmp, m4_src, "expert-scale-grid",
            edit_tensors(lambda t: t.update({gate_up + "_scale_inv": torch.ones(5, 2, 1)})),
            [gate_up + "_scale_inv", "[5, 2, 1]", "one per slice"])
    refused(tmp, m4_src, "stray-activation-scale",
            edit_tensors(lambda t: t.update({"model.norm.activation_scale": torch.tensor(1.0)})),
            ["model.norm.activation_scale", "unexpected"])
    refused(tmp, src, "bad-block", edit_config(lambda c: c["quantization_config"].update(weight_block_size=[0, 128])),
            ["config.json", "weight_block_size"])
print("ok")
