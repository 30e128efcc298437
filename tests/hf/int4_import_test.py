"""Kimi-K2's INT4 releases (K2-Thinking, K2.5): DeepSeek-V3's architecture whose routed experts
are compressed-tensors "pack-quantized" INT4 (symmetric, groups of 32 along the input:
`weight_packed` I32 [out, in / 8], `weight_scale` BF16 [out, in / 32], `weight_shape`), the rest
bf16, config.json's quantization_config as the releases write it. A tiny random DeepSeek-V3
(tests/hf/tiny_families.py) is quantized with compressed-tensors' own quantize + pack_to_int32;
import-hf must give weights bitwise equal to compressed-tensors' own decompression
(PackedQuantizationCompressor.decompress, then fp32), tensor for tensor, against the import of the
same model with those decompressed weights as a plain source; eval matches transformers on it.
Damaged sources exit 2 naming the file and the tensor or key: a missing scale or shape, a scale of
the wrong shape, a weight_shape that disagrees, packed tensors without the quantization_config,
8-bit or asymmetric schemes, another compressed-tensors format.
usage: int4_import_test.py MOE_TRAIN_BINARY"""
import json
import pathlib
import re
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file

try:
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.lifecycle.forward import quantize
except ImportError as e:  # the oracle is installed by scripts/setup for the tests
    print(f"compressed-tensors missing ({e}): run scripts/setup")
    sys.exit(1)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import hf_parity  # noqa: E402
from tiny_families import COMMON, MLA_FAMILIES  # noqa: E402
from lora_common import runner  # noqa: E402 (on the path hf_parity sets)

BIN = sys.argv[1]
run = runner(BIN)
GROUP = 32
SCHEME = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
    num_bits=4, type="int", symmetric=True, strategy="group", group_size=GROUP))
ROUTED = re.compile(r"mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")
# As Kimi-K2-Thinking's config.json (the released keys, its ignore list).
QUANTIZATION_CONFIG = {
    "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
    "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "output_activations": None,
                                  "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                              "group_size": GROUP, "dynamic": False, "actorder": None,
                                              "observer": "minmax", "observer_kwargs": {}}}},
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", r"re:.*mlp\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": None}


def int4_sources(tmp):
    """The INT4 source, and the same model with compressed-tensors' decompression as plain fp32."""
    cls, extra = MLA_FAMILIES["deepseek_v3"]
    torch.manual_seed(11)
    model = transformers.AutoModelForCausalLM.from_config(cls(**{**COMMON, **extra})).eval()
    plain = tmp / "plain"
    model.save_pretrained(plain)
    packed, ref, n = {}, {}, 0
    for name, t in load_file(plain / "model.safetensors").items():
        if not ROUTED.search(name):
            packed[name] = t.to(torch.bfloat16)  # the releases' other weights: bf16
            ref[name] = packed[name].float()
            continue
        w = t.to(torch.bfloat16)
        out, cols = w.shape
        scale = (w.float().view(out, cols // GROUP, GROUP).abs().amax(-1) / 7).clamp_min(1e-8).to(torch.bfloat16)
        q = quantize(x=w, scale=scale, zero_point=None, args=SCHEME.weights, dtype=torch.int8)
        base = name[:-len("weight")]
        part = {"weight_packed": pack_to_int32(q, 4), "weight_scale": scale,
                "weight_shape": torch.tensor([out, cols])}
        packed.update({base + k: v for k, v in part.items()})
        ref[name] = PackedQuantizationCompressor.decompress(part, SCHEME)["weight"].float()
        n += 1
    assert n >= 3 * 4 * 2, f"only {n} INT4 matrices"
    src, dequantized = tmp / "int4", tmp / "dequantized"
    src.mkdir()
    dequantized.mkdir()
    save_file(packed, src / "model.safetensors", metadata={"format": "pt"})
    save_file(ref, dequantized / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((plain / "config.json").read_text())
    (dequantized / "config.json").write_text(json.dumps(config))
    config["quantization_config"] = QUANTIZATION_CONFIG
    (src / "config.json").write_text(json.dumps(config))
    return src, dequantized, n


def refused(tmp, src, tag, change, words):
    hf_parity.refused(BIN, tmp, src, tag, change, words)


edit_tensors, edit_config = hf_parity.edit_tensors, hf_parity.edit_config


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    src, dequantized, n = int4_sources(tmp)
    a, b = tmp / "imported-int4", tmp / "imported-ref"
    run("import-hf", src, "--out", a)
    run("import-hf", dequantized, "--out", b)
    ours, theirs = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert ours.keys() == theirs.keys(), ours.keys() ^ theirs.keys()
    differ = [k for k in ours if not torch.equal(ours[k], theirs[k])]
    assert not differ, f"not bitwise compressed-tensors' decompression: {differ[:5]}"
    print(f"ok   {n} INT4 expert matrices, {len(ours)} tensors imported bitwise equal to "
          f"PackedQuantizationCompressor.decompress (then fp32)")

    run("make-synthetic", "--out", tmp / "data", "--vocab", "320", "--programs", "4", "--doc-len", "33",
        "--train-docs", "200", "--valid-docs", "64")
    cfg = hf_parity.eval_config(tmp, "int4")
    dump = tmp / "logits.safetensors"
    r = json.loads(run("eval", "--config", cfg, "--checkpoint", a, "--dump-logits", dump).stdout)
    hf_parity.compare("INT4 import vs transformers on the decompressed model", dump, dequantized, r["loss"],
                      1e-5, 1e-6)

    g = "model.layers.1.mlp.experts.0.gate_proj.weight"
    refused(tmp, src, "missing-scale", edit_tensors(lambda t: t.pop(g + "_scale")),
            [g + "_packed", g + "_scale", "model.safetensors"])
    refused(tmp, src, "missing-shape", edit_tensors(lambda t: t.pop(g + "_shape")), [g + "_shape"])
    refused(tmp, src, "scale-shape", edit_tensors(lambda t: t.update({g + "_scale": torch.ones(32, 1).bfloat16()})),
            [g + "_scale", "[32, 1]", "[32, 2]"])
    refused(tmp, src, "weight-shape", edit_tensors(lambda t: t.update({g + "_shape": torch.tensor([32, 96])})),
            [g + "_packed", "[32, 8]", "[32, 12]"])
    refused(tmp, src, "no-quantization-config", edit_config(lambda c: c.pop("quantization_config")),
            [g + "_packed", "quantization_config"])
    refused(tmp, src, "8-bit", edit_config(
        lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"].update(num_bits=8)),
            ["config.json", "num_bits"])
    refused(tmp, src, "asymmetric", edit_config(
        lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"].update(symmetric=False)),
            ["config.json", "symmetric"])
    refused(tmp, src, "format", edit_config(lambda c: c["quantization_config"].update(format="int-quantized")),
            ["config.json", "format", "int-quantized"])
print("ok")
