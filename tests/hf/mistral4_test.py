"""Mistral Small 4 against transformers' own Mistral4ForCausalLM (transformers 5.25 maps mistral4
to no causal-LM auto class; tests/hf/tiny_families.py registers that class): tiny random models
built locally from Mistral4Config with the family's real settings (nothing is downloaded):
DeepSeek-V3's latent attention with a query bottleneck, YaRN (factor 4 over 16 original
positions, mscale_all_dim 1), queries scaled past the original window (llama_4_scaling_beta 0.1,
so positions 16-31 of each 32-token window are scaled), softmax routing over 4 experts top-2
renormalised and scaled by 1.5, a shared expert, a dense first layer, experts saved fused:

  - import-hf (fp32 single file; bf16 shards) -> `eval --dump-logits`: loss within 1e-6 relative of
    transformers, logits within 1e-5; without the query scaling the logits move;
  - 10 steps of full fine-tuning -> export-hf (experts.gate_up_proj / down_proj again) ->
    transformers loads it with no missing, unexpected or mismatched keys and its logits are within
    1e-5 of `eval --dump-logits`; import-hf of the export is bitwise identical to the trained one;
  - 10 steps of full fine-tuning against transformers training the same model (float64 AdamW on
    moe-train's batches): per-step loss within 1e-5 relative, logits and weights within 1e-5.

usage: mistral4_test.py MOE_TRAIN_BINARY
"""
import json
import pathlib
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file

import hf_parity  # noqa: E402
from lora_common import runner  # noqa: E402 (on the path hf_parity sets)
from tiny_families import COMMON, MISTRAL3_VL_FAMILIES, MISTRAL4_FAMILIES  # noqa: E402

BIN = sys.argv[1]
LOGITS_TOL, LOSS_RTOL = 1e-5, 1e-6
run = runner(BIN)
CLS, EXTRA = MISTRAL4_FAMILIES["mistral4"]


def tiny_model(**changes):
    torch.manual_seed(9)
    model = transformers.AutoModelForCausalLM.from_config(CLS(**{**COMMON, **EXTRA, **changes})).eval()
    assert type(model).__name__ == "Mistral4ForCausalLM", type(model).__name__
    return model


def compare(what, dump_path, model_dir, eval_loss):
    hf_parity.compare(what, dump_path, model_dir, eval_loss, LOGITS_TOL, LOSS_RTOL)


def round_trip(tmp, model, tag, sharded=False):
    print(f"Mistral Small 4 {tag}:")
    _, imported, cfg, _ = hf_parity.import_and_compare(run, tmp, model, tag, compare, sharded)
    trained = hf_parity.train_and_export(run, cfg, imported, tmp / f"run-{tag}", tmp / f"exported-{tag}")
    exported = tmp / f"exported-{tag}"
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["Mistral4ForCausalLM"], config["architectures"]
    rope = config["rope_parameters"]
    assert (rope["rope_type"], rope["llama_4_scaling_beta"], rope["mscale_all_dim"]) == ("yarn", 0.1, 1.0), rope
    names = load_file(exported / "model.safetensors").keys()
    assert "model.layers.1.mlp.experts.gate_up_proj" in names, "experts written fused, as released"
    hf_parity.exported_matches(run, tmp, tag, cfg, trained, exported, 10, compare)


def scaling_matters(tmp):
    """The same weights without llama_4_scaling_beta give other logits past the window (by more
    than ten times the parity bar): the parity above held the query scaling, not a no-op."""
    src = tmp / "hf-fp32"
    config = json.loads((src / "config.json").read_text())
    config["rope_parameters"]["llama_4_scaling_beta"] = 0.0
    plain = tmp / "hf-unscaled"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps(config))
    (plain / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
    tokens = torch.randint(3, COMMON["vocab_size"], (2, 32), generator=torch.Generator().manual_seed(5))
    diff = (hf_parity.hf_logits(src, tokens) - hf_parity.hf_logits(plain, tokens)).abs().max().item()
    print(f"  max |logit difference| without the query scaling: {diff:.2e}")
    # The parity bar is LOGITS_TOL: an effect ten times that is one the checks above would catch.
    assert diff > 10 * LOGITS_TOL, "llama_4_scaling_beta changes nothing the parity checks would see"


def vision_language(tmp):
    """Mistral Small 4 as released: Mistral3ForConditionalGeneration (text model under
    language_model.model.*, head language_model.lm_head, a Pixtral tower and projector beside it,
    the text keys in text_config). import-hf trains the text model; its logits on text are
    transformers'; export-hf writes the release's class again with every tensor present and the
    vision tower and projector bitwise as they were."""
    print("Mistral Small 4 as released (vision-language):")
    vl_class, vl_extra = MISTRAL3_VL_FAMILIES["mistral3"]
    torch.manual_seed(13)
    text = CLS(**{**COMMON, **EXTRA})
    model = transformers.Mistral3ForConditionalGeneration(vl_class(text_config=text.to_dict(), **vl_extra)).eval()
    src = tmp / "hf-vl"
    model.save_pretrained(src)
    saved = load_file(src / "model.safetensors")
    carried = {k: v for k, v in saved.items() if k.startswith(("vision_tower.", "multi_modal_projector."))}
    assert carried and "language_model.lm_head.weight" in saved, sorted(saved)[:5]
    imported = tmp / "imported-vl"
    run("import-hf", src, "--out", imported)
    cfg = hf_parity.eval_config(tmp, "vl")

    def check(what, dump_path, model_dir, tol):
        hf_parity.class_logits_match(transformers.Mistral3ForConditionalGeneration, what, dump_path,
                                     model_dir, tol)

    dump = tmp / "logits-vl.safetensors"
    run("eval", "--config", cfg, "--checkpoint", imported, "--dump-logits", dump)
    check("imported", dump, src, LOGITS_TOL)
    exported = tmp / "exported-vl"
    trained = hf_parity.train_and_export(run, cfg, imported, tmp / "run-vl", exported, steps=4)
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["Mistral3ForConditionalGeneration"], config["architectures"]
    assert config["text_config"]["model_type"] == "mistral4" and "vision_config" in config
    out = load_file(exported / "model.safetensors")
    assert all(torch.equal(out[k], v) for k, v in carried.items()), "the vision tower changed"
    dump = tmp / "logits-vl-trained.safetensors"
    run("eval", "--config", cfg, "--checkpoint", trained, "--dump-logits", dump)
    check("trained 4 steps, exported", dump, exported, LOGITS_TOL)
    print(f"  the export holds the {len(carried)} vision-tower and projector tensors bitwise as imported")


def stacked(exported):
    """Our export as transformers holds it in memory: the same names (experts already fused)."""
    return exported


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    run("make-synthetic", "--out", tmp / "data", "--vocab", "320", "--programs", "4", "--doc-len", "33",
        "--train-docs", "800", "--valid-docs", "64")
    round_trip(tmp, tiny_model(), "fp32")
    scaling_matters(tmp)
    round_trip(tmp, tiny_model(), "bf16-sharded", sharded=True)
    vision_language(tmp)
    print("Mistral Small 4 full fine-tuning vs transformers:")
    hf_parity.full_fine_tuning_peer(run, tmp, tiny_model(), LOGITS_TOL, 1e-5, as_saved=stacked)
print("ok")
