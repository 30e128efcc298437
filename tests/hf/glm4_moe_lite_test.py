"""GLM-4.7-Flash against transformers' Glm4MoeLiteForCausalLM (tiny random models built locally
from Glm4MoeLiteConfig with the family's settings; nothing is downloaded): DeepSeek-V3's latent
attention (a query bottleneck, interleaved rotary pairs) and GLM's router (sigmoid scores with a
non-zero e_score_correction_bias, renormalised, routed_scaling_factor 1.8) with a shared expert,
dense layers named by mlp_layer_types, here not only the first (dense, sparse, dense, sparse):

  - import-hf (fp32 single file; bf16 shards) -> `eval --dump-logits`: loss within 1e-6 relative of
    transformers, logits within 1e-5;
  - 10 steps of full fine-tuning -> export-hf writes Glm4MoeLiteForCausalLM again (not DeepSeek-V3,
    whose checkpoints these are too) with mlp_layer_types -> transformers loads it with no missing,
    unexpected or mismatched keys and its logits are within 1e-5; import-hf of the export is
    bitwise identical to the trained checkpoint;
  - 10 steps of full fine-tuning against transformers training the same model (float64 AdamW on
    moe-train's batches): per-step loss within 1e-5 relative, logits and weights within 1e-5.

usage: glm4_moe_lite_test.py MOE_TRAIN_BINARY
"""
import json
import pathlib
import sys
import tempfile

import torch
import transformers

import hf_parity  # noqa: E402
from lora_common import runner  # noqa: E402 (on the path hf_parity sets)
from tiny_families import COMMON, MLA_FAMILIES  # noqa: E402

BIN = sys.argv[1]
LOGITS_TOL, LOSS_RTOL = 1e-5, 1e-6
TYPES = ["dense", "sparse", "dense", "sparse"]
run = runner(BIN)


def tiny_model(**changes):
    cls, extra = MLA_FAMILIES["glm4_moe_lite"]
    keys = {**COMMON, **extra, "num_hidden_layers": 4, "mlp_layer_types": TYPES, "n_routed_experts": 8,
            "pad_token_id": None, "max_position_embeddings": 4096, **changes}
    keys.pop("first_k_dense_replace")
    torch.manual_seed(7)
    return hf_parity.shift_correction_biases(
        transformers.AutoModelForCausalLM.from_config(cls(**keys)).eval())


def compare(what, dump_path, model_dir, eval_loss):
    hf_parity.compare(what, dump_path, model_dir, eval_loss, LOGITS_TOL, LOSS_RTOL)


def round_trip(tmp, model, tag, sharded=False):
    print(f"GLM-4.7-Flash {tag}:")
    _, imported, cfg, _ = hf_parity.import_and_compare(run, tmp, model, tag, compare, sharded)
    state = json.loads((imported / "state.json").read_text())
    assert state["config"]["moe"]["mlp_only_layers"] == [0, 2], state["config"]["moe"]["mlp_only_layers"]
    exported = tmp / f"exported-{tag}"
    trained = hf_parity.train_and_export(run, cfg, imported, tmp / f"run-{tag}", exported)
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["Glm4MoeLiteForCausalLM"], config["architectures"]
    assert config["mlp_layer_types"] == TYPES and config["routed_scaling_factor"] == 1.8, config
    hf_parity.exported_matches(run, tmp, tag, cfg, trained, exported, 10, compare)


def stacked(exported):
    """An export's per-expert matrices as transformers holds them (hf_parity.stacked_experts)."""
    return hf_parity.stacked_experts(exported, [i for i, t in enumerate(TYPES) if t == "sparse"], 8)


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    run("make-synthetic", "--out", tmp / "data", "--vocab", "320", "--programs", "4", "--doc-len", "33",
        "--train-docs", "800", "--valid-docs", "64")
    round_trip(tmp, tiny_model(), "fp32")
    round_trip(tmp, tiny_model(), "bf16-sharded", sharded=True)
    print("GLM-4.7-Flash full fine-tuning vs transformers:")
    hf_parity.full_fine_tuning_peer(run, tmp, tiny_model(), LOGITS_TOL, 1e-5, as_saved=stacked)
print("ok")
