"""gpt-oss against transformers' GptOssForCausalLM (a tiny random model built locally from
GptOssConfig with the family's real settings: YaRN rotary, attention sinks, sliding windows
alternating with full attention, q/k/v/o and router and expert biases, clamped SwiGLU;
nothing is downloaded):

  - 4 layers (sliding, full, sliding, full) with a window of 8 inside 32-token windows, 8 experts
    top-2, non-zero sinks and biases, gate/up weights large enough that the SwiGLU clamp binds:
    import-hf (fp32 single file, and bf16 shards) -> `eval --dump-logits`: loss within 1e-6
    relative of transformers, logits within 1e-5;
  - 10 steps of full fine-tuning against transformers training the same model (float64 AdamW
    on moe-train's batches): per-step loss within 1e-5 relative, weights within 1e-5;
  - 10 steps of full fine-tuning -> export-hf -> transformers loads it with no missing or
    unexpected keys and its logits are within 1e-5 of `eval --dump-logits`; import-hf of the
    export is bitwise identical to the trained checkpoint;
  - MXFP4: a checkpoint whose experts are packed as released (gate_up_proj_blocks / _scales,
    down_proj_blocks / _scales, quantization_config mxfp4) imports to weights bitwise equal to
    transformers' own dequantization (integrations/mxfp4.py convert_moe_packed_tensors).

usage: gpt_oss_test.py MOE_TRAIN_BINARY
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
from hf_parity import hf_logits, newest_checkpoint  # noqa: E402

BIN = sys.argv[1]
LOGITS_TOL, LOSS_RTOL = 1e-5, 1e-6
CONFIG = dict(vocab_size=320, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2,
              intermediate_size=48, sliding_window=8, max_position_embeddings=4096,
              tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=None,
              router_aux_loss_coef=0.01)


run = runner(BIN)  # lora_common: the binary's result, a failure ends the test


def tiny_model(**changes):
    torch.manual_seed(11)
    config = transformers.GptOssConfig(**{**CONFIG, **changes})
    assert config.layer_types == ["sliding_attention", "full_attention"] * 2
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # transformers initialises biases to zero and sinks small: make them count
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.normal_(0.0, 1.0)
            elif "bias" in name:
                p.normal_(0.0, 0.3)
            elif name.endswith("experts.gate_up_proj"):
                p.normal_(0.0, 0.6)  # pre-activations past +-7: the clamp binds
    return model


def clamp_binds(model, tokens):
    """The fraction of gate/up pre-activations beyond the clamp in the first MoE layer."""
    seen = []
    experts = model.model.layers[0].mlp.experts
    original = experts._apply_gate

    def spy(gate_up):
        seen.append((gate_up.abs() > experts.limit).float().mean().item())
        return original(gate_up)
    experts._apply_gate = spy
    with torch.no_grad():
        model(input_ids=tokens)
    experts._apply_gate = original
    return max(seen)


def compare(what, dump_path, model_dir, eval_loss):
    hf_parity.compare(what, dump_path, model_dir, eval_loss, LOGITS_TOL, LOSS_RTOL)


def round_trip(tmp, model, sharded):
    tag = "bf16-sharded" if sharded else "fp32"
    print(f"gpt-oss {tag}:")
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
    r2 = hf_parity.exported_matches(run, tmp, tag, cfg, trained, exported, 10, compare)


def full_fine_tuning_peer(tmp, model):
    """10 full fine-tuning steps against transformers training the same model in float64
    (hf_parity.full_fine_tuning_peer); transformers' own float32 training differs from that
    float64 one by up to 3.5e-5 after these 10 steps."""
    print("gpt-oss full fine-tuning vs transformers:")
    hf_parity.full_fine_tuning_peer(run, tmp, model, LOGITS_TOL, 1e-5)

def mxfp4_base(tmp, src, imported):
    """LoRA over the MXFP4 experts kept 4-bit (quantization.quant_method mxfp4, the checkpoint's
    own codes) trains as LoRA over the same values held in 16 bits: step-0 logits within 1e-5,
    10 steps' losses within 1e-6 relative; the base fingerprint tells the two apart; --merge gives
    transformers our logits."""
    print("gpt-oss LoRA over MXFP4 experts kept 4-bit:")
    targets = ["q_proj", "v_proj", "gate_up_proj", "down_proj"]
    runs = {}
    for tag, base, quant in (("mxfp4", src, {"quant_method": "mxfp4"}), ("16-bit", imported, {})):
        out = tmp / f"run-lora-{tag}"
        cfg = tmp / f"lora-{tag}.json"
        cfg.write_text(json.dumps({
            "train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
            "lora": {"r": 4, "lora_alpha": 8, "target_modules": targets},
            "quantization": quant,
            "model": {"seq_len": 32, "init_from": str(base)},
            "data": {"train_path": str(tmp / "data/train.h5"), "valid_path": str(tmp / "data/valid.h5"),
                     "shuffle": False},
            "training": {"device": "cpu", "output_dir": str(out), "train_iters": 10,
                         "eval_interval": 0, "eval_iters": 4},
            "checkpoint": {"save_initial": True}}))
        run("--config", cfg, "-q")
        losses = [json.loads(l)["loss"] for l in open(out / "metrics.jsonl") if '"train"' in l]
        dump = tmp / f"logits-lora-{tag}.safetensors"
        run("eval", "--config", cfg, "--checkpoint", out / "checkpoints/step-00000000", "--dump-logits", dump)
        state = json.loads((out / "checkpoints/step-00000010/state.json").read_text())
        runs[tag] = (losses, load_file(dump)["logits"], state["lora_base_fingerprint"], out, cfg)
    (lq, gq, fq, out, cfg), (l16, g16, f16, _, _) = runs["mxfp4"], runs["16-bit"]
    worst = max(abs(a - b) / abs(b) for a, b in zip(lq, l16))
    diff = (gq - g16).abs().max().item()
    print(f"  step-0 logits vs the 16-bit base: {diff:.1e}; 10 steps' losses: worst rel {worst:.1e}")
    assert len(lq) == 10 and worst <= LOSS_RTOL and diff <= LOGITS_TOL, (worst, diff)
    assert fq != f16, "the MXFP4 base has its own fingerprint"
    merged = tmp / "merged-mxfp4"
    run("export-hf", out / "checkpoints/step-00000010", "--merge", "--out", merged)
    config = json.loads((merged / "config.json").read_text())
    assert "quantization_config" not in config, "the merged export is 16/32-bit"
    dump = tmp / "logits-lora-mxfp4-10.safetensors"
    run("eval", "--config", cfg, "--checkpoint", out / "checkpoints/step-00000010", "--dump-logits", dump)
    d = load_file(dump)
    theirs = hf_logits(merged, d["tokens"][:, :-1])
    merged_diff = (theirs - d["logits"]).abs().max().item()
    print(f"  export-hf --merge: transformers' logits within {merged_diff:.1e} of ours")
    assert merged_diff <= LOGITS_TOL, merged_diff


def mxfp4_import(tmp, model):
    """Experts packed as gpt-oss is released; the import must equal transformers' dequantization."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    print("gpt-oss MXFP4 experts:")
    src = tmp / "hf-mxfp4"
    model.save_pretrained(src)
    tensors = load_file(src / "model.safetensors")
    gen = torch.Generator().manual_seed(3)
    packed = {}
    for name in list(tensors):
        if not (name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj")):
            continue
        E, rows_in, cols = tensors.pop(name).shape  # [E, in, out]: blocks run along `in`
        blocks = torch.randint(0, 256, (E, cols, rows_in // 32, 16), generator=gen, dtype=torch.uint8)
        # e8m0 scales 2^-9 .. 2^-4: weights up to 0.375, as trained checkpoints hold them
        scales = torch.randint(118, 124, (E, cols, rows_in // 32), generator=gen, dtype=torch.uint8)
        tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
        packed[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4",
                                     "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                "model.layers.*.mlp.router",
                                                                "model.embed_tokens", "lm_head"]}
    (src / "config.json").write_text(json.dumps(config))
    imported = tmp / "imported-mxfp4"
    run("import-hf", src, "--out", imported)
    ours = load_file(imported / "model.safetensors")
    for name, want in packed.items():
        layer = name.split(".")[2]
        mine = f"blocks.{layer}.moe.experts."
        if name.endswith("gate_up_proj"):
            got = {"w_gate": want[..., 0::2], "w_up": want[..., 1::2]}
        else:
            got = {"w_down": want}
        for ours_name, t in got.items():
            assert ours[mine + ours_name].dtype == torch.float32
            assert torch.equal(ours[mine + ours_name], t.contiguous()), f"{mine + ours_name} differs"
    print(f"  {len(packed)} MXFP4 stacks imported bitwise equal to convert_moe_packed_tensors")
    mxfp4_base(tmp, src, imported)
    bad = tmp / "hf-mxfp4-bad"
    bad.mkdir()
    for f in src.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    t = load_file(bad / "model.safetensors")
    t["model.layers.0.mlp.experts.down_proj_scales"] = t["model.layers.0.mlp.experts.down_proj_scales"][..., :-1].contiguous()
    save_file(t, bad / "model.safetensors", metadata={"format": "pt"})
    r = run("import-hf", bad, "--out", tmp / "bad-import", ok=False)
    assert r.returncode == 2 and "down_proj_scales" in r.stderr and "MXFP4" in r.stderr, r.stderr
    assert not (tmp / "bad-import").exists(), "nothing left behind"
    print("  damaged scales: exit 2 naming the tensor")


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    run("make-synthetic", "--out", tmp / "data", "--vocab", "320", "--programs", "4", "--doc-len", "33",
        "--train-docs", "800", "--valid-docs", "64")
    model = tiny_model()
    frac = clamp_binds(model, torch.randint(0, 320, (2, 32), generator=torch.Generator().manual_seed(1)))
    print(f"gate/up pre-activations beyond the clamp in layer 0: {frac:.1%}")
    assert frac > 0.01, "the clamp must bind for the test to check it"
    for sharded in (False, True):
        round_trip(tmp, model, sharded)
    full_fine_tuning_peer(tmp, tiny_model())
    mxfp4_import(tmp, tiny_model(intermediate_size=64))  # MXFP4 blocks of 32 along d and f
print("ok")
