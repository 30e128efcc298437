"""DeepSeek-V3 (Kimi, Moonlight) and DeepSeek-V2 (V2-Lite, V2.5) against transformers'
DeepseekV3ForCausalLM / DeepseekV2ForCausalLM (tiny random models built locally from the config
classes with each family's real settings; nothing is downloaded):

  - V3-shaped: multi-head latent attention with a query bottleneck (q_lora_rank), interleaved
    rotary pairs, YaRN with mscale_all_dim (the softmax scale's mscale^2, factor 40 as released),
    sigmoid routing with a non-zero e_score_correction_bias, expert groups (n_group 4, topk_group
    2), routed_scaling_factor 2.5, a shared expert, a dense first layer (first_k_dense_replace 1);
  - V2-Lite-shaped: latent attention without the query bottleneck (q_lora_rank null), V2's
    complex-form rotary, softmax greedy routing never renormalised, two shared experts, YaRN
    with mscale 0.707;
  - V2-shaped with topk_method group_limited_greedy (groups scored by their best expert; 16
    experts top-6 in 8 groups of which 3 are kept, so the group rule changes choices),
    routed_scaling_factor 16, saved as bf16 shards.

Each: import-hf -> `eval --dump-logits`: loss within 1e-6 relative of transformers, logits
within 1e-5; 10 steps of full fine-tuning -> export-hf -> transformers loads it with no missing,
unexpected or mismatched keys and its logits are within 1e-5 of `eval --dump-logits`; import-hf
of the export is bitwise the trained checkpoint. Then 10 full fine-tuning steps of the V3 shape
against transformers training the same model in float64 (per-step loss within 1e-5 relative,
logits and weights within 1e-5), and a V3 source with a multi-token-prediction layer (imports
with one warning counting the skipped tensors; its export loads with no missing keys).

usage: deepseek_test.py MOE_TRAIN_BINARY
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
# DeepSeek-V3's shape, shrunk: 128 heads of 128 + 64 -> 4 of 16 + 8, v 128 -> 12, latents
# 1536 / 512 -> 24 / 16; 256 experts top-8 in 8 groups (4 kept) -> 8 experts top-2 in 4 (2 kept).
COMMON = dict(vocab_size=320, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
              num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16,
              qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, n_routed_experts=8,
              num_experts_per_tok=2, first_k_dense_replace=1, rms_norm_eps=1e-6,
              tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=None,
              max_position_embeddings=163840)


def yarn(mscale):
    return {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": mscale,
            "mscale_all_dim": mscale, "original_max_position_embeddings": 4096,
            "beta_fast": 32.0, "beta_slow": 1.0}


V3 = dict(COMMON, q_lora_rank=24, n_shared_experts=1, n_group=4, topk_group=2,
          routed_scaling_factor=2.5, norm_topk_prob=True, rope_interleave=True,
          rope_parameters=yarn(1.0), num_nextn_predict_layers=0)
V2_LITE = dict(COMMON, q_lora_rank=None, n_shared_experts=2, topk_method="greedy", n_group=1,
               topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=False,
               rope_parameters=yarn(0.707))
# DeepSeek-V2's 160 experts top-6 in 8 groups (3 kept) -> 16 top-6 in 8 groups of 2 (3 kept):
# with top_k > topk_group the group rule decides (with top_k <= topk_group it equals greedy).
V2_GROUPS = dict(V2_LITE, topk_method="group_limited_greedy", n_routed_experts=16,
                 num_experts_per_tok=6, n_group=8, topk_group=3, routed_scaling_factor=16.0,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0})

run = runner(BIN)  # lora_common: the binary's result, a failure ends the test


def tiny_model(config, **changes):
    torch.manual_seed(7)
    cls = transformers.DeepseekV3Config if "rope_interleave" in config else transformers.DeepseekV2Config
    model = transformers.AutoModelForCausalLM.from_config(cls(**{**config, **changes})).eval()
    with torch.no_grad():  # the correction bias starts at zero: make it count
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.05)  # sigmoid scores lie in (0, 1): this reorders choices
    return model


def compare(what, dump_path, model_dir, eval_loss):
    hf_parity.compare(what, dump_path, model_dir, eval_loss, LOGITS_TOL, LOSS_RTOL)


def round_trip(tmp, model, tag, architecture, sharded=False):
    print(f"{tag}:")
    src = tmp / f"hf-{tag}"
    if sharded:
        model.to(torch.bfloat16).save_pretrained(src, max_shard_size="60KB")
        model.to(torch.float32)
        assert (src / "model.safetensors.index.json").exists()
    else:
        model.save_pretrained(src)
    imported = tmp / f"imported-{tag}"
    run("import-hf", src, "--out", imported)
    cfg = hf_parity.eval_config(tmp, tag)
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
    assert config["architectures"] == [architecture], config["architectures"]
    source = json.loads((src / "config.json").read_text())
    for key in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                "n_group", "topk_group", "routed_scaling_factor", "n_shared_experts",
                "first_k_dense_replace", "topk_method", "rope_interleave"):
        if key in source:
            assert config.get(key) == source[key], f"{key}: exported {config.get(key)} vs {source[key]}"
    hf_parity.exported_matches(run, tmp, tag, cfg, trained, exported, 10, compare)


def stacked(exported):
    """An export's per-expert matrices (the released layout) stacked as transformers holds them
    in memory: gate_up_proj [E, 2f, d] (gate rows first), down_proj [E, d, f]."""
    out = dict(exported)
    E = COMMON["n_routed_experts"]
    for layer in range(COMMON["first_k_dense_replace"], COMMON["num_hidden_layers"]):
        p = f"model.layers.{layer}.mlp.experts."
        take = lambda proj: torch.stack([out.pop(f"{p}{e}.{proj}.weight") for e in range(E)])
        gate, up, down = take("gate_proj"), take("up_proj"), take("down_proj")
        out[p + "gate_up_proj"] = torch.cat([gate, up], 1)
        out[p + "down_proj"] = down
    return out


def mtp_source(tmp, model):
    """A released-style V3 source with one multi-token-prediction layer (DeepSeek-V3's layer 61:
    enorm, hnorm, eh_proj, shared_head and a whole decoder layer): its tensors are skipped with
    one warning that counts them; the rest imports to transformers' loss, and the export of the
    import loads with no missing keys."""
    print("DeepSeek-V3 with a multi-token-prediction layer:")
    src = tmp / "hf-mtp"
    model.save_pretrained(src)
    tensors = load_file(src / "model.safetensors")
    L, d = COMMON["num_hidden_layers"], COMMON["hidden_size"]
    extra = {f"model.layers.{L}.eh_proj.weight": torch.randn(d, 2 * d),
             f"model.layers.{L}.enorm.weight": torch.ones(d),
             f"model.layers.{L}.hnorm.weight": torch.ones(d),
             f"model.layers.{L}.shared_head.norm.weight": torch.ones(d),
             f"model.layers.{L}.self_attn.q_a_proj.weight": torch.randn(24, d),
             f"model.layers.{L}.self_attn.kv_a_proj_with_mqa.weight": torch.randn(24, d)}
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
    cfg = hf_parity.eval_config(tmp, "mtp")
    r = json.loads(run("eval", "--config", cfg, "--checkpoint", imported, "--dump-logits", dump).stdout)
    compare("imported without its MTP layer", dump, src, r["loss"])
    exported = tmp / "exported-mtp"
    run("export-hf", imported, "--out", exported)
    _, info = transformers.AutoModelForCausalLM.from_pretrained(exported, output_loading_info=True)
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        assert not info[k], f"mtp export: transformers reports {k}: {info[k]}"
    assert json.loads((exported / "config.json").read_text())["num_nextn_predict_layers"] == 0
    print("  its export loads with no missing, unexpected or mismatched keys")


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    run("make-synthetic", "--out", tmp / "data", "--vocab", "320", "--programs", "4", "--doc-len", "33",
        "--train-docs", "800", "--valid-docs", "64")
    round_trip(tmp, tiny_model(V3), "DeepSeek-V3", "DeepseekV3ForCausalLM")
    round_trip(tmp, tiny_model(V2_LITE), "DeepSeek-V2-Lite", "DeepseekV2ForCausalLM")
    round_trip(tmp, tiny_model(V2_GROUPS), "DeepSeek-V2-groups-bf16", "DeepseekV2ForCausalLM",
               sharded=True)
    print("DeepSeek-V3 full fine-tuning vs transformers:")
    hf_parity.full_fine_tuning_peer(run, tmp, tiny_model(V3), LOGITS_TOL, 1e-5, as_saved=stacked)
    mtp_source(tmp, tiny_model(V3, n_group=1, topk_group=1))
print("ok")
