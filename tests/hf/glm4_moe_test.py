"""GLM-4.5 against transformers' Glm4MoeForCausalLM (tiny random models built locally from
Glm4MoeConfig with the family's real settings; nothing is downloaded): partial rotary 0.5, q/k/v
biases without an o bias, per-head q/k norms on and off, a dense first layer
(first_k_dense_replace 1), a shared expert, sigmoid routing with a non-zero
e_score_correction_bias, expert groups (n_group 4, topk_group 2, as DeepSeek-V3 routes) and
routed_scaling_factor 2.5:

  - import-hf (fp32 single file; bf16 shards) -> `eval --dump-logits`: loss within 1e-6
    relative of transformers, logits within 1e-5;
  - 10 steps of full fine-tuning -> export-hf -> transformers loads it with no missing,
    unexpected or mismatched keys and its logits are within 1e-5 of `eval --dump-logits`;
    import-hf of the export is bitwise identical to the trained checkpoint;
  - 10 steps of full fine-tuning against transformers training the same model (float64 AdamW
    on moe-train's batches): per-step loss within 1e-5 relative, logits and weights within 1e-5;
  - a source with a multi-token-prediction layer (num_nextn_predict_layers 1, its tensors under
    model.layers.<num_hidden_layers>.*) imports with one warning naming how many tensors were
    skipped.

usage: glm4_moe_test.py MOE_TRAIN_BINARY
"""
import json
import pathlib
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file

import hf_parity  # noqa: E402
from lora_common import runner  # noqa: E402 (on the path hf_parity sets)
from hf_parity import newest_checkpoint  # noqa: E402

BIN = sys.argv[1]
LOGITS_TOL, LOSS_RTOL = 1e-5, 1e-6
# GLM-4.5-Air's shape, shrunk: 96 heads of 128 with 8 key-value heads -> 4 of 16 with 2;
# 128 experts top-8 in 1 group -> 8 experts top-2 in 4 groups (DeepSeek-V3's routing).
CONFIG = dict(vocab_size=320, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.5, attention_bias=True,
              use_qk_norm=True, intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8,
              num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=4,
              topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True, rope_theta=1e6,
              max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
              num_nextn_predict_layers=0, bos_token_id=1, eos_token_id=2, pad_token_id=None)


run = runner(BIN)  # lora_common: the binary's result, a failure ends the test


def tiny_model(**changes):
    torch.manual_seed(7)
    config = transformers.Glm4MoeConfig(**{**CONFIG, **changes})
    assert config.rope_parameters["partial_rotary_factor"] == CONFIG.get("partial_rotary_factor")
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # biases and the correction bias start at zero: make them count
        for name, p in model.named_parameters():
            if name.endswith("_proj.bias"):
                p.normal_(0.0, 0.3)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.05)  # sigmoid scores lie in (0, 1): this reorders choices
    return model


def compare(what, dump_path, model_dir, eval_loss):
    hf_parity.compare(what, dump_path, model_dir, eval_loss, LOGITS_TOL, LOSS_RTOL)


def eval_config(tmp, tag, **model):
    cfg = tmp / f"eval-{tag}.json"
    cfg.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 4,
        "data": {"train_path": str(tmp / "data/train.h5"), "valid_path": str(tmp / "data/valid.h5")},
        "model": {"seq_len": 32, **model},
        "training": {"eval_iters": 4, "device": "cpu", "output_dir": str(tmp / f"run-{tag}")}}))
    return cfg


def round_trip(tmp, model, tag, sharded=False):
    print(f"GLM-4.5 {tag}:")
    src = tmp / f"hf-{tag}"
    if sharded:
        model.to(torch.bfloat16).save_pretrained(src, max_shard_size="60KB")
        model.to(torch.float32)
        assert (src / "model.safetensors.index.json").exists()
    else:
        model.save_pretrained(src)
    imported = tmp / f"imported-{tag}"
    run("import-hf", src, "--out", imported)
    state = json.loads((imported / "state.json").read_text())
    biases = state.get("expert_biases", {})
    assert len(biases) == 2, f"the two MoE layers' correction biases: {list(biases)}"
    cfg = eval_config(tmp, tag)
    dump = tmp / f"logits-{tag}.safetensors"
    r = json.loads(run("eval", "--config", cfg, "--checkpoint", imported, "--dump-logits", dump).stdout)
    compare("imported", dump, src, r["loss"])
    run("--config", cfg, "-q", "--set", f"model.init_from={imported}", "--set", "training.train_iters=10",
        "--set", "training.eval_interval=0", "--set", "optimizer.params.lr=0.003",
        "--set", "scheduler.params.warmup_num_steps=2")
    trained = newest_checkpoint(tmp / f"run-{tag}")
    exported = tmp / f"exported-{tag}"
    run("export-hf", trained, "--out", exported)
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["Glm4MoeForCausalLM"], config["architectures"]
    assert config["rope_parameters"]["partial_rotary_factor"] == 0.5
    hf_parity.exported_matches(run, tmp, tag, cfg, trained, exported, 10, compare)


def stacked(exported):
    """An export's per-expert matrices (the released layout) stacked as transformers holds them
    in memory: gate_up_proj [E, 2f, d] (gate rows first), down_proj [E, d, f]."""
    out = dict(exported)
    E = CONFIG["n_routed_experts"]
    for layer in range(CONFIG["first_k_dense_replace"], CONFIG["num_hidden_layers"]):
        p = f"model.layers.{layer}.mlp.experts."
        take = lambda proj: torch.stack([out.pop(f"{p}{e}.{proj}.weight") for e in range(E)])
        gate, up, down = take("gate_proj"), take("up_proj"), take("down_proj")
        out[p + "gate_up_proj"] = torch.cat([gate, up], 1)
        out[p + "down_proj"] = down
    return out


def full_fine_tuning_peer(tmp, model):
    """10 full fine-tuning steps against transformers training the same model in float64
    (hf_parity.full_fine_tuning_peer); the correction bias stays as imported on both sides."""
    print("GLM-4.5 full fine-tuning vs transformers:")
    hf_parity.full_fine_tuning_peer(run, tmp, model, LOGITS_TOL, 1e-5, as_saved=stacked)

def mtp_source(tmp, model):
    """A released-style source with one multi-token-prediction layer: its tensors are skipped
    with one warning that counts them; the rest imports to transformers' loss."""
    print("GLM-4.5 with a multi-token-prediction layer:")
    src = tmp / "hf-mtp"
    model.save_pretrained(src)
    tensors = load_file(src / "model.safetensors")
    L, d = CONFIG["num_hidden_layers"], CONFIG["hidden_size"]
    extra = {f"model.layers.{L}.eh_proj.weight": torch.randn(d, 2 * d),
             f"model.layers.{L}.enorm.weight": torch.ones(d),
             f"model.layers.{L}.hnorm.weight": torch.ones(d),
             f"model.layers.{L}.shared_head.norm.weight": torch.ones(d),
             f"model.layers.{L}.self_attn.q_proj.weight": torch.randn(64, d)}
    tensors.update(extra)
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    (src / "config.json").write_text(json.dumps(config))
    imported = tmp / "imported-mtp"
    r = run("import-hf", src, "--out", imported)
    warned = [l for l in r.stderr.splitlines() if "multi-token-prediction" in l]
    assert len(warned) == 1 and f"{len(extra)} tensors" in warned[0], r.stderr
    print(f"  {warned[0].strip()}")
    dump = tmp / "logits-mtp.safetensors"
    cfg = eval_config(tmp, "mtp")
    r = json.loads(run("eval", "--config", cfg, "--checkpoint", imported, "--dump-logits", dump).stdout)
    compare("imported without its MTP layer", dump, src, r["loss"])


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    run("make-synthetic", "--out", tmp / "data", "--vocab", "320", "--programs", "4", "--doc-len", "33",
        "--train-docs", "800", "--valid-docs", "64")
    round_trip(tmp, tiny_model(), "qk-norm")
    round_trip(tmp, tiny_model(use_qk_norm=False), "no-qk-norm-bf16", sharded=True)
    full_fine_tuning_peer(tmp, tiny_model())
    mtp_source(tmp, tiny_model(n_group=1, topk_group=1, routed_scaling_factor=1.0))
print("ok")
