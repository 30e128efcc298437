"""MiniMax-M2 against transformers' MiniMaxM2ForCausalLM (tiny random models built locally from
MiniMaxM2Config with the family's real settings, tests/hf/tiny_families.py; nothing is downloaded):
q/k norms over the whole projected q and k (4 heads of 32 on a width of 64, as the release's 48 x 128
on 3,072), partial rotary 0.5, sigmoid routing with a non-zero e_score_correction_bias (beside the
router, not under it) on 8 experts top-2 renormalised, experts as w1/w3/w2 per expert:

  - import-hf (fp32 single file; bf16 shards) -> `eval --dump-logits`: loss within 1e-6 relative of
    transformers, logits within 1e-5;
  - 10 steps of full fine-tuning -> export-hf -> transformers loads it with no missing, unexpected
    or mismatched keys and its logits are within 1e-5 of `eval --dump-logits`; import-hf of the
    export is bitwise identical to the trained checkpoint;
  - the releases' legacy `rotary_dim` (64 of head_dim 128 there) imports as the same factor;
  - 10 steps of full fine-tuning against transformers training the same model (float64 AdamW on
    moe-train's batches): per-step loss within 1e-5 relative, logits and weights within 1e-5.

usage: minimax_m2_test.py MOE_TRAIN_BINARY
"""
import json
import pathlib
import sys
import tempfile

import torch
import transformers

import hf_parity  # noqa: E402
from lora_common import runner  # noqa: E402 (on the path hf_parity sets)
from hf_parity import newest_checkpoint  # noqa: E402
from tiny_families import COMMON, SIGMOID_FAMILIES  # noqa: E402

BIN = sys.argv[1]
LOGITS_TOL, LOSS_RTOL = 1e-5, 1e-6
run = runner(BIN)


def tiny_model(**changes):
    cls, extra = SIGMOID_FAMILIES["minimax_m2"]
    torch.manual_seed(7)
    config = cls(**{**COMMON, **extra, "max_position_embeddings": 4096, **changes})
    assert config.rope_parameters["partial_rotary_factor"] == 0.5
    return hf_parity.shift_correction_biases(
        transformers.AutoModelForCausalLM.from_config(config).eval())


def compare(what, dump_path, model_dir, eval_loss):
    hf_parity.compare(what, dump_path, model_dir, eval_loss, LOGITS_TOL, LOSS_RTOL)


def round_trip(tmp, model, tag, sharded=False):
    print(f"MiniMax-M2 {tag}:")
    _, imported, cfg, _ = hf_parity.import_and_compare(run, tmp, model, tag, compare, sharded)
    biases = json.loads((imported / "state.json").read_text()).get("expert_biases", {})
    assert len(biases) == 3, f"every layer's correction bias: {list(biases)}"
    trained = hf_parity.train_and_export(run, cfg, imported, tmp / f"run-{tag}", tmp / f"exported-{tag}")
    exported = tmp / f"exported-{tag}"
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["MiniMaxM2ForCausalLM"], config["architectures"]
    assert config["rope_parameters"]["partial_rotary_factor"] == 0.5, config["rope_parameters"]
    hf_parity.exported_matches(run, tmp, tag, cfg, trained, exported, 10, compare)


def legacy_rotary_dim(tmp, model):
    """The releases write rotary_dim (64 of head_dim 128), not partial_rotary_factor."""
    print("MiniMax-M2 with the releases' rotary_dim:")
    src = tmp / "hf-rotary-dim"
    model.save_pretrained(src)
    config = json.loads((src / "config.json").read_text())
    config["rope_parameters"].pop("partial_rotary_factor")
    config["rotary_dim"] = 16
    (src / "config.json").write_text(json.dumps(config))
    assert transformers.AutoConfig.from_pretrained(src).rope_parameters["partial_rotary_factor"] == 0.5
    imported = tmp / "imported-rotary-dim"
    run("import-hf", src, "--out", imported)
    dump = tmp / "logits-rotary-dim.safetensors"
    r = json.loads(run("eval", "--config", hf_parity.eval_config(tmp, "rotary-dim"), "--checkpoint", imported,
                       "--dump-logits", dump).stdout)
    compare("rotary_dim 16 of 32", dump, src, r["loss"])


def stacked(exported):
    """An export's per-expert w1/w3/w2 as transformers holds them in memory, the correction bias
    under mlp (hf_parity.stacked_experts)."""
    renamed = {k.replace("block_sparse_moe.", "mlp."): v for k, v in exported.items()}
    return hf_parity.stacked_experts(renamed, range(COMMON["num_hidden_layers"]),
                                     SIGMOID_FAMILIES["minimax_m2"][1]["num_local_experts"],
                                     ("w1", "w3", "w2"))


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    run("make-synthetic", "--out", tmp / "data", "--vocab", "320", "--programs", "4", "--doc-len", "33",
        "--train-docs", "800", "--valid-docs", "64")
    round_trip(tmp, tiny_model(), "fp32")
    round_trip(tmp, tiny_model(), "bf16-sharded", sharded=True)
    legacy_rotary_dim(tmp, tiny_model())
    print("MiniMax-M2 full fine-tuning vs transformers:")
    hf_parity.full_fine_tuning_peer(run, tmp, tiny_model(), LOGITS_TOL, 1e-5, as_saved=stacked)
print("ok")
