"""ERNIE 4.5 MoE against transformers' Ernie4_5_MoeForCausalLM (tiny random models built locally
from Ernie4_5_MoeConfig with the family's real settings, tests/hf/tiny_families.py; nothing is
downloaded): rotary on interleaved pairs over GQA, softmax routing over 8 experts top-2 whose
selection adds a non-zero correction bias (mlp.moe_statics, [1, E]) that the weights do not get,
a shared expert, layer 0 dense (moe_layer_start_index 1), tied embeddings, config keys moe_k /
moe_num_experts:

  - import-hf (fp32 single file; bf16 shards) -> `eval --dump-logits`: loss within 1e-6 relative of
    transformers, logits within 1e-5; the bias changes which experts are chosen (without it the
    logits move);
  - 10 steps of full fine-tuning -> export-hf -> transformers loads it with no missing, unexpected
    or mismatched keys and its logits are within 1e-5 of `eval --dump-logits`; import-hf of the
    export is bitwise identical to the trained checkpoint;
  - dense layers after the MoE ones too (moe_layer_end_index) and every second layer
    (moe_layer_interval 2): import matches, export writes the same three keys back;
  - a released directory's MTP tensors (model.mtp_*) are skipped; use_bias true is refused;
  - 10 steps of full fine-tuning against transformers training the same model (float64 AdamW on
    moe-train's batches): per-step loss within 1e-5 relative, logits and weights within 1e-5.

usage: ernie4_5_moe_test.py MOE_TRAIN_BINARY
"""
import json
import pathlib
import subprocess
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file

import hf_parity  # noqa: E402
from lora_common import runner  # noqa: E402 (on the path hf_parity sets)
from tiny_families import COMMON, SOFTMAX_BIAS_FAMILIES  # noqa: E402

BIN = sys.argv[1]
LOGITS_TOL, LOSS_RTOL = 1e-5, 1e-6
run = runner(BIN)
CLS, EXTRA = SOFTMAX_BIAS_FAMILIES["ernie4_5_moe"]


def tiny_model(**changes):
    torch.manual_seed(7)
    config = CLS(**{**COMMON, **EXTRA, "max_position_embeddings": 4096, **changes})
    return hf_parity.shift_correction_biases(
        transformers.AutoModelForCausalLM.from_config(config).eval())


def compare(what, dump_path, model_dir, eval_loss):
    hf_parity.compare(what, dump_path, model_dir, eval_loss, LOGITS_TOL, LOSS_RTOL)


def moe_layers(config):
    return [i for i in range(config["num_hidden_layers"])
            if (i + 1) % config["moe_layer_interval"] == 0
            and config["moe_layer_start_index"] <= i <= config["moe_layer_end_index"]]


def round_trip(tmp, model, tag, sharded=False):
    print(f"ERNIE 4.5 {tag}:")
    _, imported, cfg, _ = hf_parity.import_and_compare(run, tmp, model, tag, compare, sharded)
    biases = json.loads((imported / "state.json").read_text()).get("expert_biases", {})
    assert len(biases) == 2, f"the two MoE layers' correction biases: {list(biases)}"
    trained = hf_parity.train_and_export(run, cfg, imported, tmp / f"run-{tag}", tmp / f"exported-{tag}")
    exported = tmp / f"exported-{tag}"
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["Ernie4_5_MoeForCausalLM"], config["architectures"]
    assert (config["moe_k"], config["moe_num_experts"], config["moe_layer_start_index"],
            config["tie_word_embeddings"]) == (2, 8, 1, True), config
    assert "num_experts_per_tok" not in config, "moe_k's alias written twice"
    tensors = load_file(exported / "model.safetensors")
    assert tensors["model.layers.1.mlp.moe_statics.e_score_correction_bias"].shape == (1, 8)
    assert "lm_head.weight" not in tensors, "tied embeddings: no separate head"
    hf_parity.exported_matches(run, tmp, tag, cfg, trained, exported, 10, compare)


def bias_matters(tmp):
    """The same model with its correction biases zeroed gives other logits: the bias is taking
    part in the selection the parity above checked."""
    src = tmp / "hf-fp32"
    tensors = load_file(src / "model.safetensors")
    for k in tensors:
        if k.endswith("e_score_correction_bias"):
            tensors[k] = torch.zeros_like(tensors[k])
    unbiased = tmp / "hf-unbiased"
    unbiased.mkdir()
    (unbiased / "config.json").write_text((src / "config.json").read_text())
    save_file(tensors, unbiased / "model.safetensors", metadata={"format": "pt"})
    tokens = torch.randint(3, COMMON["vocab_size"], (2, 32), generator=torch.Generator().manual_seed(5))
    diff = (hf_parity.hf_logits(src, tokens) - hf_parity.hf_logits(unbiased, tokens)).abs().max().item()
    print(f"  max |logit difference| with the correction biases zeroed: {diff:.2e}")
    assert diff > 1e-3, "the correction biases choose no other expert: the check above proves nothing"


def layer_rules(tmp):
    """Dense layers after the MoE range and between MoE layers: each layout imports exactly and
    exports the same moe_layer_* keys."""
    for tag, changes in (("end-index", dict(num_hidden_layers=4, moe_layer_end_index=2)),
                         ("interval", dict(num_hidden_layers=4, moe_layer_start_index=0, moe_layer_interval=2))):
        print(f"ERNIE 4.5 {tag}:")
        model = tiny_model(**changes)
        src, imported, cfg, _ = hf_parity.import_and_compare(run, tmp, model, tag, compare)
        exported = tmp / f"exported-{tag}"
        run("export-hf", imported, "--out", exported)
        theirs = json.loads((src / "config.json").read_text())
        mine = json.loads((exported / "config.json").read_text())
        assert moe_layers(mine) == moe_layers(theirs), (moe_layers(mine), moe_layers(theirs))
        print(f"  MoE layers {moe_layers(theirs)} of 4 in and out")


def mtp_and_bias_refusal(tmp, model):
    """A released directory holds its MTP layer as model.mtp_*: skipped as transformers skips it.
    use_bias true: refused naming the key."""
    src = tmp / "hf-mtp"
    model.save_pretrained(src)
    tensors = load_file(src / "model.safetensors")
    tensors["model.mtp_linear_proj.0.weight"] = torch.zeros(64, 128)
    tensors["model.mtp_emb_norm.0.weight"] = torch.ones(64)
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    (src / "config.json").write_text(json.dumps(config))
    r = run("import-hf", src, "--out", tmp / "imported-mtp")
    assert "multi-token" in r.stdout + r.stderr or "MTP" in r.stdout + r.stderr, r.stderr[-400:]
    config["use_bias"] = True
    (src / "config.json").write_text(json.dumps(config))
    r = subprocess.run([BIN, "import-hf", str(src), "--out", str(tmp / "imported-bias")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "use_bias" in r.stderr and "config.json" in r.stderr, r.stderr[-400:]
    assert not (tmp / "imported-bias").exists(), "a refused import leaves nothing"
    print("ERNIE 4.5: MTP tensors skipped; use_bias refused in one line")


def stacked(exported):
    """An export's per-expert experts as transformers holds them in memory, the correction bias
    under the router (Ernie4_5_MoeTopKRouter.moe_statics), the tied head the embedding."""
    renamed = {k.replace("mlp.moe_statics.", "mlp.gate.moe_statics."): v for k, v in exported.items()}
    renamed["lm_head.weight"] = renamed["model.embed_tokens.weight"]
    config = {**COMMON, **EXTRA, "moe_layer_interval": 1, "moe_layer_end_index": COMMON["num_hidden_layers"] - 1}
    return hf_parity.stacked_experts(renamed, moe_layers(config), EXTRA["moe_num_experts"])


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    run("make-synthetic", "--out", tmp / "data", "--vocab", "320", "--programs", "4", "--doc-len", "33",
        "--train-docs", "800", "--valid-docs", "64")
    round_trip(tmp, tiny_model(), "fp32")
    bias_matters(tmp)
    round_trip(tmp, tiny_model(), "bf16-sharded", sharded=True)
    layer_rules(tmp)
    mtp_and_bias_refusal(tmp, tiny_model())
    print("ERNIE 4.5 full fine-tuning vs transformers:")
    hf_parity.full_fine_tuning_peer(run, tmp, tiny_model(), LOGITS_TOL, 1e-5, as_saved=stacked)
print("ok")
