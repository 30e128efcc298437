"""Gemma 4 MoE against transformers' Gemma4ForCausalLM and Gemma4ForConditionalGeneration (tiny
random models built locally from Gemma4TextConfig with the 26B-A4B's settings, tests/hf/
tiny_families.py; nothing is downloaded): five sliding layers (window 8, shorter than the 32-token
windows) and one full-attention layer of its own head width and kv heads with K reused as V and
proportional rotary, q/k/v norms, sandwich norms, the dense GeGLU MLP beside the GeGLU experts with
Gemma's router, layer scalars, scaled embeddings (sqrt(48), rounded in bf16) and soft-capped logits.
Every norm weight, router scale, per-expert scale and layer scalar is randomised (they start at 1).

  - import-hf (fp32 single file; bf16 shards) -> `eval --dump-logits`: loss within 1e-6 relative of
    transformers, logits within 1e-5;
  - 10 steps of full fine-tuning -> export-hf -> transformers loads it with no missing, unexpected
    or mismatched keys and its logits are within 1e-4 of `eval --dump-logits`; import-hf of the
    export is bitwise identical to the trained checkpoint;
  - the release layout (Gemma4ForConditionalGeneration, model.language_model.*): import, the same
    logits, export back as the release class, loaded cleanly;
  - config.json with the older plain keys (global_head_dim, num_global_key_value_heads) imports as
    the same model; a dense or per-layer-embedding Gemma 4 is refused naming the key.

usage: gemma4_test.py MOE_TRAIN_BINARY
"""
import json
import pathlib
import subprocess
import sys
import tempfile

import torch
import transformers

import hf_parity  # noqa: E402
from lora_common import runner  # noqa: E402 (on the path hf_parity sets)
from tiny_families import GEMMA4_FAMILIES, GEMMA4_RELEASE_FAMILIES  # noqa: E402

BIN = sys.argv[1]
LOGITS_TOL, EXPORT_TOL, LOSS_RTOL = 1e-5, 1e-4, 1e-6
run = runner(BIN)


def randomised(model):
    """Every parameter or buffer that starts at one (norm weights, router scales, per-expert
    scales, layer scalars) drawn around it, so a misplaced one shows. And the routers' gates
    times 20: Gemma 4's router scales its normed input by hidden^-0.5, so at the init's 0.02 std
    every expert gets ~1/8 and the top-2 often ties within float32 rounding, which then decides
    (even transformers against itself at another batch size: the GEMMs block differently); a
    trained router's logits are units apart."""
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith(("norm.weight", "router.scale", "per_expert_scale", "layer_scalar")):
                t.copy_(1.0 + 0.3 * torch.randn_like(t))
            if name.endswith("router.proj.weight"):
                t.mul_(20.0)
    return model


def tiny_model(release=False):
    cls, extra = (GEMMA4_RELEASE_FAMILIES["gemma4"] if release else GEMMA4_FAMILIES["gemma4_text"])
    torch.manual_seed(11)
    config = cls(**extra)
    model = (transformers.Gemma4ForConditionalGeneration(config) if release
             else transformers.AutoModelForCausalLM.from_config(config))
    text = config.get_text_config()
    assert text.per_layer_config[5].head_dim == 32 and text.per_layer_config[5].num_key_value_heads == 1
    return randomised(model.eval())


def compare(what, dump_path, model_dir, eval_loss, tol=LOGITS_TOL):
    hf_parity.compare(what, dump_path, model_dir, eval_loss, tol, LOSS_RTOL)


def round_trip(tmp, model, tag, sharded=False):
    print(f"Gemma 4 {tag}:")
    _, imported, cfg, _ = hf_parity.import_and_compare(run, tmp, model, tag, compare, sharded)
    trained = hf_parity.train_and_export(run, cfg, imported, tmp / f"run-{tag}", tmp / f"exported-{tag}")
    exported = tmp / f"exported-{tag}"
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["Gemma4ForCausalLM"], config["architectures"]
    assert config["per_layer_config"] == {"5": {"head_dim": 32, "num_key_value_heads": 1}}, config
    hf_parity.exported_matches(run, tmp, tag, cfg, trained, exported, 10,
                               lambda *a: compare(*a, tol=EXPORT_TOL))


def release_layout(tmp):
    """Gemma4ForConditionalGeneration's checkpoint: the text model under model.language_model."""
    print("Gemma 4 as released (Gemma4ForConditionalGeneration):")
    model = tiny_model(release=True)
    src, imported = tmp / "hf-release", tmp / "imported-release"
    model.save_pretrained(src)
    run("import-hf", src, "--out", imported)
    cfg = hf_parity.eval_config(tmp, "release")
    dump = tmp / "logits-release.safetensors"
    r = json.loads(run("eval", "--config", cfg, "--checkpoint", imported, "--dump-logits", dump).stdout)
    hf_parity.class_logits_match(transformers.Gemma4ForConditionalGeneration, "imported", dump, src,
                                 LOGITS_TOL)
    exported = tmp / "exported-release"
    run("export-hf", imported, "--out", exported)
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["Gemma4ForConditionalGeneration"], config["architectures"]
    assert config["text_config"]["model_type"] == "gemma4_text", config["text_config"]
    hf_parity.class_logits_match(transformers.Gemma4ForConditionalGeneration, "exported", dump,
                                 exported, LOGITS_TOL)
    print(f"  eval loss {r['loss']:.6f}")


def older_keys(tmp, model):
    """config.json with global_head_dim / num_global_key_value_heads in place of per_layer_config
    (transformers before 5.25's per_layer_config) imports as the same model."""
    print("Gemma 4 with the plain global_head_dim keys:")
    src = tmp / "hf-older-keys"
    model.save_pretrained(src)
    config = json.loads((src / "config.json").read_text())
    config.pop("per_layer_config")
    config.update(global_head_dim=32, num_global_key_value_heads=1)
    (src / "config.json").write_text(json.dumps(config))
    imported = tmp / "imported-older-keys"
    run("import-hf", src, "--out", imported)
    dump = tmp / "logits-older-keys.safetensors"
    r = json.loads(run("eval", "--config", hf_parity.eval_config(tmp, "older-keys"), "--checkpoint",
                       imported, "--dump-logits", dump).stdout)
    hf_parity.compare("global_head_dim keys", dump, tmp / "hf-fp32", r["loss"], LOGITS_TOL, LOSS_RTOL)


def refusals(tmp):
    src = tmp / "hf-fp32"
    for key, value, words in (("enable_moe_block", False, "dense Gemma 4"),
                              ("hidden_size_per_layer_input", 256, "per-layer input embeddings"),
                              ("num_kv_shared_layers", 2, "key/value sharing")):
        bad = tmp / f"hf-bad-{key}"
        subprocess.run(["cp", "-r", str(src), str(bad)], check=True)
        config = json.loads((bad / "config.json").read_text())
        config[key] = value
        (bad / "config.json").write_text(json.dumps(config))
        p = subprocess.run([BIN, "import-hf", str(bad), "--out", str(tmp / f"imp-bad-{key}")],
                           capture_output=True, text=True)
        line = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
        assert p.returncode == 2 and key in line and words in line and "config.json" in line, (p.returncode, p.stderr)
        print(f"  refused: {line}")


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    run("make-synthetic", "--out", tmp / "data", "--vocab", "320", "--programs", "4", "--doc-len", "33",
        "--train-docs", "800", "--valid-docs", "64")
    round_trip(tmp, tiny_model(), "fp32")
    round_trip(tmp, tiny_model(), "bf16-sharded", sharded=True)
    older_keys(tmp, tiny_model())
    refusals(tmp)
    release_layout(tmp)
print("ok")
