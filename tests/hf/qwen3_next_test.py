"""Qwen3-Next and Qwen3.5-MoE against transformers' Qwen3NextForCausalLM and
Qwen3_5MoeForCausalLM (tiny random models built locally from their config classes with the
families' real settings; nothing is downloaded): 3 Gated DeltaNet layers and 1 gated-attention
layer, two value heads per key head, zero-centred norms, partial rotary 0.25, a sigmoid-gated
shared expert; Qwen3-Next with its fused per-key-head projections and a dense layer, Qwen3.5
with split projections. Windows of 80 tokens: one whole 64-token chunk of the delta rule and a
partial one.

  - import-hf (fp32 single file; bf16 shards) -> `eval --dump-logits`: loss within 1e-6
    relative of transformers, logits within 1e-5;
  - 10 steps of full fine-tuning -> export-hf -> transformers loads it with no missing,
    unexpected or mismatched keys and its logits are within 1e-4 of `eval --dump-logits`;
    import-hf of the export is bitwise identical to the trained checkpoint;
  - the released layout (experts fused into gate_up_proj / down_proj stacks, an mtp.* head):
    imports with one warning counting the skipped mtp.* tensors, logits as the per-expert save;
  - Qwen3.5 as released (Qwen3_5MoeForConditionalGeneration, a vision tower beside the text
    model): import -> eval logits within 1e-5 of transformers, 4 steps -> export-hf writes the
    release's class with every tensor present, the vision tower bitwise as imported;
  - LoRA on attention and experts, 3 steps -> export-hf --adapter: transformers + PEFT on the
    source gives our logits within 1e-5;
  - 10 steps of full fine-tuning against transformers training the same model (float64 AdamW
    on moe-train's batches): per-step loss within 1e-5 relative, logits within 1e-5, weights
    within 1e-5 or twice transformers' own float32 distance (see full_fine_tuning_peer below).

usage: qwen3_next_test.py MOE_TRAIN_BINARY
"""
import json
import pathlib
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file

import hf_parity  # noqa: E402
from tiny_families import HYBRID, HYBRID_FAMILIES, VL_FAMILIES  # noqa: E402
from lora_common import runner  # noqa: E402 (on the path hf_parity sets)
from hf_parity import newest_checkpoint  # noqa: E402

BIN = sys.argv[1]
LOGITS_TOL, LOSS_RTOL, EXPORT_TOL = 1e-5, 1e-6, 1e-4
SEQ = 80
# Qwen3-Next-80B-A3B's shape, shrunk (tiny_families.HYBRID): 16 key / 32 value heads of 128 ->
# 2 / 4 of 16; attention 16 heads of 256 on 2 key-value heads -> 4 of 32 on 2; 512 experts
# top-10 -> 4 top-2.
MODELS = {"qwen3_next": transformers.Qwen3NextForCausalLM,
          "qwen3_5_moe_text": transformers.Qwen3_5MoeForCausalLM}

run = runner(BIN)  # lora_common: the binary's result, a failure ends the test


def tiny_model(family):
    config_class, extra = HYBRID_FAMILIES[family]
    torch.manual_seed(11)
    config = config_class(**{**HYBRID, **extra})
    assert config.layer_types == ["linear_attention"] * 3 + ["full_attention"], config.layer_types
    model = MODELS[family](config).eval()
    with torch.no_grad():  # zero-centred norms start at 0 and the gated norm at 1: make them count
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                p.normal_(0.0 if "linear_attn.norm" not in name else 1.0, 0.1)
    return model


def compare(what, dump_path, model_dir, eval_loss, tol=LOGITS_TOL):
    hf_parity.compare(what, dump_path, model_dir, eval_loss, tol, LOSS_RTOL)


def eval_config(tmp, tag, seq=SEQ):
    cfg = tmp / f"eval-{tag}.json"
    cfg.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 4,
        "data": {"train_path": str(tmp / "data/train.h5"), "valid_path": str(tmp / "data/valid.h5")},
        "model": {"seq_len": seq},
        "training": {"eval_iters": 4, "device": "cpu", "output_dir": str(tmp / f"run-{tag}")}}))
    return cfg


def round_trip(tmp, family, sharded=False):
    tag = family + ("-bf16" if sharded else "")
    print(f"{family} {'bf16 shards' if sharded else 'fp32'}:")
    model = tiny_model(family)
    src = tmp / f"hf-{tag}"
    hf_parity.save_source(model, src, sharded)
    imported = tmp / f"imported-{tag}"
    run("import-hf", src, "--out", imported)
    cfg = eval_config(tmp, tag)
    dump = tmp / f"logits-{tag}.safetensors"
    r = json.loads(run("eval", "--config", cfg, "--checkpoint", imported, "--dump-logits", dump).stdout)
    compare("imported", dump, src, r["loss"])
    exported = tmp / f"exported-{tag}"
    trained = hf_parity.train_and_export(run, cfg, imported, tmp / f"run-{tag}", exported)
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == [MODELS[family].__name__], config["architectures"]
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    check = lambda what, dump, model_dir, loss: compare(what, dump, model_dir, loss, EXPORT_TOL)
    hf_parity.exported_matches(run, tmp, tag, cfg, trained, exported, 10, check)


def stacked(family):
    """An export's per-expert matrices stacked as transformers holds them in memory."""
    def to_memory(exported):
        out = dict(exported)
        E = HYBRID["num_experts"]
        dense = HYBRID_FAMILIES[family][1].get("mlp_only_layers", [])
        for layer in range(HYBRID["num_hidden_layers"]):
            if layer in dense:
                continue
            p = f"model.layers.{layer}.mlp.experts."
            take = lambda proj: torch.stack([out.pop(f"{p}{e}.{proj}.weight") for e in range(E)])
            gate, up, down = take("gate_proj"), take("up_proj"), take("down_proj")
            out[p + "gate_up_proj"] = torch.cat([gate, up], 1)
            out[p + "down_proj"] = down
        return out
    return to_memory


def released_layout(tmp):
    """Qwen3.5 as its bf16 releases are laid out: the routed experts fused into
    mlp.experts.gate_up_proj [E, 2f, d] and down_proj [E, d, f], and a multi-token-prediction
    head under mtp.*. The import reads the fused stacks, skips mtp.* with one warning counting
    its tensors, and gives the logits of the same weights saved per expert."""
    print("qwen3_5_moe_text, released layout (fused experts, mtp.*):")
    family = "qwen3_5_moe_text"
    per_expert = tmp / "hf-per-expert"
    tiny_model(family).save_pretrained(per_expert)
    src = tmp / "hf-released"
    src.mkdir()
    for name in ("config.json", "generation_config.json"):
        if (per_expert / name).exists():
            (src / name).write_text((per_expert / name).read_text())
    tensors = stacked(family)(load_file(per_expert / "model.safetensors"))
    d = HYBRID["hidden_size"]
    mtp = {"mtp.fc.weight": torch.randn(d, 2 * d), "mtp.norm.weight": torch.zeros(d),
           "mtp.pre_fc_norm_embedding.weight": torch.zeros(d),
           "mtp.pre_fc_norm_hidden.weight": torch.zeros(d),
           "mtp.layers.0.self_attn.q_proj.weight": torch.randn(256, d)}
    save_file({**tensors, **mtp}, src / "model.safetensors", metadata={"format": "pt"})
    imported = tmp / "imported-released"
    r = run("import-hf", src, "--out", imported)
    warned = [l for l in r.stderr.splitlines() if "multi-token-prediction" in l]
    assert len(warned) == 1 and f"{len(mtp)} tensors" in warned[0], r.stderr
    print(f"  {warned[0].strip()}")
    cfg = eval_config(tmp, "released")
    dump = tmp / "logits-released.safetensors"
    r = json.loads(run("eval", "--config", cfg, "--checkpoint", imported, "--dump-logits", dump).stdout)
    compare("fused experts, against the per-expert save", dump, per_expert, r["loss"])


def vision_language(tmp):
    """Qwen3.5 as released: Qwen3_5MoeForConditionalGeneration (text model under
    model.language_model.*, a vision tower under model.visual.*, the text keys in text_config).
    import-hf trains the text model; its logits on text are transformers' (the multimodal rotary
    on text positions is the 1-D one); export-hf writes the release's class again with every
    tensor present and the vision tower bitwise as it was."""
    print("Qwen3.5-MoE as released (vision-language):")
    text_class, text_extra = HYBRID_FAMILIES["qwen3_5_moe_text"]
    vl_class, vl_extra = VL_FAMILIES["qwen3_5_moe"]
    torch.manual_seed(13)
    text = text_class(**{**HYBRID, **text_extra})
    config = vl_class(text_config=text.to_dict(), tie_word_embeddings=False, **vl_extra)
    model = transformers.Qwen3_5MoeForConditionalGeneration(config).eval()
    src = tmp / "hf-vl"
    model.save_pretrained(src)
    saved = load_file(src / "model.safetensors")
    visual = {k: v for k, v in saved.items() if k.startswith("model.visual.")}
    assert visual and any(k.startswith("model.language_model.layers.0.linear_attn") for k in saved)
    imported = tmp / "imported-vl"
    run("import-hf", src, "--out", imported)
    cfg = eval_config(tmp, "vl")
    dump = tmp / "logits-vl.safetensors"

    release_class = transformers.Qwen3_5MoeForConditionalGeneration

    def check(what, dump_path, model_dir, eval_loss, tol):
        hf_parity.class_logits_match(release_class, what, dump_path, model_dir, tol)

    r = json.loads(run("eval", "--config", cfg, "--checkpoint", imported, "--dump-logits", dump).stdout)
    check("imported", dump, src, r["loss"], LOGITS_TOL)
    exported = tmp / "exported-vl"
    trained = hf_parity.train_and_export(run, cfg, imported, tmp / "run-vl", exported, steps=4)
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5MoeForConditionalGeneration"], config["architectures"]
    assert config["text_config"]["model_type"] == "qwen3_5_moe_text" and "vision_config" in config
    out = load_file(exported / "model.safetensors")
    for k, v in visual.items():
        assert torch.equal(out[k], v), f"{k}: the vision tower changed"
    dump = tmp / "logits-vl-trained.safetensors"
    r = json.loads(run("eval", "--config", cfg, "--checkpoint", trained, "--dump-logits", dump).stdout)
    check("trained 4 steps, exported", dump, exported, r["loss"], EXPORT_TOL)
    print(f"  the export holds the {len(visual)} vision-tower tensors bitwise as imported")
    # A run that starts from the release directory itself (model.init_from, no import-hf):
    # the export takes the vision tower from there.
    run("--config", cfg, "-q", "--set", f"model.init_from={src}", "--set", "training.train_iters=2",
        "--set", "training.eval_interval=0", "--set", f"training.output_dir={tmp / 'run-vl-direct'}")
    direct = tmp / "exported-vl-direct"
    run("export-hf", newest_checkpoint(tmp / "run-vl-direct"), "--out", direct)
    out = load_file(direct / "model.safetensors")
    assert all(torch.equal(out[k], v) for k, v in visual.items()), "vision tower from init_from"
    hf_parity.loaded_cleanly(release_class, direct)  # every tensor present
    print("  from model.init_from = the release: exported with its vision tower")


def lora_adapter(tmp, family):
    """LoRA over the attention layers' q/k/v/o and every MoE layer's experts (the Gated DeltaNet
    projections have no adapters yet), 3 steps -> export-hf --adapter -> transformers + PEFT on
    the source model gives moe-train's logits (and not the base's: the adapters count)."""
    import peft
    print(f"{family} LoRA -> PEFT adapter:")
    src = tmp / f"hf-{family}"  # round_trip saved it
    cfg = tmp / f"lora-{family}.json"
    cfg.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "lora": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj",
                                                             "gate_proj", "up_proj", "down_proj"]},
        "model": {"seq_len": SEQ, "init_from": str(tmp / f"imported-{family}")},
        "data": {"train_path": str(tmp / "data/train.h5"), "valid_path": str(tmp / "data/valid.h5")},
        "training": {"device": "cpu", "output_dir": str(tmp / f"run-lora-{family}"), "train_iters": 3,
                     "eval_interval": 0, "eval_iters": 2}}))
    run("--config", cfg, "-q")
    trained = newest_checkpoint(tmp / f"run-lora-{family}")
    adapter = tmp / f"adapter-{family}"
    run("export-hf", trained, "--adapter", "--out", adapter)
    dump = tmp / f"logits-lora-{family}.safetensors"
    run("eval", "--config", cfg, "--checkpoint", trained, "--dump-logits", dump)
    d = load_file(dump)
    tokens = d["tokens"][:, :-1]
    base = MODELS[family].from_pretrained(src, dtype=torch.float32).eval()
    with torch.no_grad():
        plain = base(input_ids=tokens).logits
        adapted = peft.PeftModel.from_pretrained(base, adapter).eval()(input_ids=tokens).logits
    diff, effect = (adapted - d["logits"]).abs().max().item(), (plain - d["logits"]).abs().max().item()
    print(f"  PEFT vs moe-train: max |logit diff| {diff:.1e} (the adapters move the logits by {effect:.1e})")
    assert diff <= LOGITS_TOL and effect > 100 * LOGITS_TOL, (diff, effect)


def full_fine_tuning_peer(tmp, family):
    print(f"{family} full fine-tuning vs transformers:")
    peer_tmp = tmp / f"peer-{family}"
    peer_tmp.mkdir()
    (peer_tmp / "data").symlink_to(tmp / "data")
    # The weights' float32 allowance is twice transformers' own float32 distance: the worst
    # tensor is a Gated DeltaNet's A_log, whose gradient sums every token's decay term of both
    # signs; Adam normalises that near-cancelled sum, so any float32 summation order moves it by
    # a similar amount (2026-12-06: ours 6.4e-5, transformers' float32 5.1e-5 on Qwen3.5's;
    # losses agree to 1.3e-7 and logits to 2.8e-6 all the same).
    hf_parity.full_fine_tuning_peer(run, peer_tmp, tiny_model(family), LOGITS_TOL, 1e-5,
                                    as_saved=stacked(family), noise_factor=2.0)


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    run("make-synthetic", "--out", tmp / "data", "--vocab", "320", "--programs", "4", "--doc-len", "33",
        "--train-docs", "800", "--valid-docs", "64")
    families = sys.argv[2:] or list(HYBRID_FAMILIES)
    for family in families:
        round_trip(tmp, family)
    round_trip(tmp, "qwen3_5_moe_text", sharded=True)
    released_layout(tmp)
    vision_language(tmp)
    for family in families:
        lora_adapter(tmp, family)
    for family in families:
        full_fine_tuning_peer(tmp, family)
print("ok")
