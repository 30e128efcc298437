"""Nemotron-H / Nemotron 3 against transformers' NemotronHForCausalLM (a tiny random model built
locally from NemotronHConfig with the family's real settings, tests/hf/tiny_families.py; nothing
is downloaded): one sublayer per block, every kind (Mamba-2, MoE with relu2 experts, sigmoid
scores, a correction bias and a shared expert, attention without positions, a dense relu2 MLP).
Windows of 30 tokens: three whole 8-token chunks of the Mamba scan and a partial one.

  - import-hf (fp32 single file; bf16 shards) -> `eval --dump-logits`: loss within 1e-6
    relative of transformers, logits within 1e-5;
  - 10 steps of full fine-tuning -> export-hf -> transformers loads it with no missing,
    unexpected or mismatched keys and its logits are within 1e-4 of `eval --dump-logits`;
    import-hf of the export is bitwise identical to the trained checkpoint;
  - the older config form (hybrid_override_pattern "ME*-ME", mamba_* key names) imports to the
    same model;
  - LatentMoE (Nemotron 3 Super: moe_latent_size, the routed experts between fc1_latent_proj and
    fc2_latent_proj): the same import, fine-tuning and export checks, and LoRA on its experts
    (at the latent width) against transformers + PEFT;
  - LoRA on attention, the Mamba in_proj and the experts, 3 steps -> export-hf --adapter:
    transformers + PEFT on the source gives our logits within 1e-5; with out_proj (which PEFT
    refuses on Mamba models) --adapter exits 2 naming it and --merge matches transformers.

usage: nemotron_h_test.py MOE_TRAIN_BINARY
"""
import json
import pathlib
import subprocess
import sys
import tempfile

import torch
import transformers

import hf_parity  # noqa: E402
from tiny_families import MAMBA_FAMILIES  # noqa: E402
from lora_common import runner  # noqa: E402 (on the path hf_parity sets)

BIN = sys.argv[1]
LOGITS_TOL, LOSS_RTOL, EXPORT_TOL = 1e-5, 1e-6, 1e-4
SEQ = 30
run = runner(BIN)


LATENT = 24  # moe_latent_size of the LatentMoE variant: below the hidden size, not a power of 2


def tiny_model(latent=None):
    config_class, extra = MAMBA_FAMILIES["nemotron_h"]
    torch.manual_seed(17)
    model = transformers.NemotronHForCausalLM(config_class(**extra, moe_latent_size=latent)).eval()
    with torch.no_grad():  # norms at 1, D at 1, dt_bias at 1, A = 1..H: make them count
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("norm_f.weight"):
                p.normal_(1.0, 0.1)
            elif name.endswith(".D") or name.endswith("dt_bias"):
                p.normal_(0.5, 0.5)
            elif name.endswith("A_log"):
                p.uniform_(-1.0, 1.5)
    return hf_parity.shift_correction_biases(model)


def eval_config(tmp, tag):
    cfg = tmp / f"eval-{tag}.json"
    cfg.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 4,
        "data": {"train_path": str(tmp / "data/train.h5"), "valid_path": str(tmp / "data/valid.h5")},
        "model": {"seq_len": SEQ},
        "training": {"eval_iters": 4, "device": "cpu", "output_dir": str(tmp / f"run-{tag}")}}))
    return cfg


def compare(what, dump_path, model_dir, eval_loss, tol=LOGITS_TOL):
    hf_parity.compare(what, dump_path, model_dir, eval_loss, tol, LOSS_RTOL)


def import_and_eval(tmp, src, tag):
    imported = tmp / f"imported-{tag}"
    run("import-hf", src, "--out", imported)
    cfg = eval_config(tmp, tag)
    dump = tmp / f"logits-{tag}.safetensors"
    r = json.loads(run("eval", "--config", cfg, "--checkpoint", imported, "--dump-logits", dump).stdout)
    return imported, cfg, dump, r


def round_trip(tmp, sharded=False, latent=None):
    tag = "nemotron_h" + ("-bf16" if sharded else "") + (f"-latent{latent}" if latent else "")
    print(f"nemotron_h {'bf16 shards' if sharded else 'fp32'}{', LatentMoE' if latent else ''}:")
    model = tiny_model(latent)
    src = tmp / f"hf-{tag}"
    hf_parity.save_source(model, src, sharded)
    imported, cfg, dump, r = import_and_eval(tmp, src, tag)
    compare("imported", dump, src, r["loss"])
    exported = tmp / f"exported-{tag}"
    trained = hf_parity.train_and_export(run, cfg, imported, tmp / f"run-{tag}", exported)
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["NemotronHForCausalLM"], config["architectures"]
    assert config["layers_block_type"] == MAMBA_FAMILIES["nemotron_h"][1]["layers_block_type"]
    assert config["moe_latent_size"] == latent, config["moe_latent_size"]
    check = lambda what, dump, model_dir, loss: compare(what, dump, model_dir, loss, EXPORT_TOL)
    hf_parity.exported_matches(run, tmp, tag, cfg, trained, exported, 10, check)
    return src


def pattern_form(tmp, src):
    """The config as the first Nemotron-H releases wrote it: hybrid_override_pattern and the
    mamba_* names; the same weights import to the same logits."""
    print("nemotron_h, hybrid_override_pattern form:")
    old = tmp / "hf-pattern"
    old.mkdir()
    for f in src.iterdir():
        if f.name != "config.json":
            (old / f.name).symlink_to(f)
    c = json.loads((src / "config.json").read_text())
    letters = {"linear_attention": "M", "moe": "E", "full_attention": "*", "mlp": "-"}
    c["hybrid_override_pattern"] = "".join(letters[t] for t in c.pop("layers_block_type"))
    for new, legacy in (("n_groups", "mamba_n_groups"), ("conv_kernel", "mamba_d_conv"),
                        ("chunk_size", "mamba_chunk_size")):
        c[legacy] = c.pop(new)
    c["num_hidden_layers"] = len(c["hybrid_override_pattern"])
    (old / "config.json").write_text(json.dumps(c))
    _, _, dump, r = import_and_eval(tmp, old, "pattern")
    compare("pattern form, against the source", dump, src, r["loss"])


def peft_logits_match(tmp, cfg, trained, src, adapter, tag):
    """transformers + PEFT (the exported adapter on the source) gives moe-train's logits, and the
    adapters move them."""
    import peft
    from safetensors.torch import load_file
    dump = tmp / f"logits-{tag}.safetensors"
    run("eval", "--config", cfg, "--checkpoint", trained, "--dump-logits", dump)
    d = load_file(dump)
    tokens = d["tokens"][:, :-1]
    base = transformers.NemotronHForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    with torch.no_grad():
        plain = base(input_ids=tokens).logits
        adapted = peft.PeftModel.from_pretrained(base, adapter).eval()(input_ids=tokens).logits
    diff, effect = (adapted - d["logits"]).abs().max().item(), (plain - d["logits"]).abs().max().item()
    print(f"  PEFT vs moe-train: max |logit diff| {diff:.1e} (the adapters move the logits by {effect:.1e})")
    assert diff <= LOGITS_TOL and effect > 100 * LOGITS_TOL, (diff, effect)


def lora_config(tmp, tag, init_from, targets):
    cfg = tmp / f"{tag}.json"
    cfg.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "lora": {"r": 4, "lora_alpha": 8, "target_modules": targets},
        "model": {"seq_len": SEQ, "init_from": str(init_from)},
        "data": {"train_path": str(tmp / "data/train.h5"), "valid_path": str(tmp / "data/valid.h5")},
        "training": {"device": "cpu", "output_dir": str(tmp / f"run-{tag}"), "train_iters": 3,
                     "eval_interval": 0, "eval_iters": 2}}))
    return cfg


def latent_lora(tmp, src):
    """LoRA on the LatentMoE experts (their adapters at the latent width) and in_proj, 3 steps ->
    export-hf --adapter -> transformers + PEFT agrees."""
    print("nemotron_h LatentMoE LoRA (Mamba in_proj, experts) -> PEFT adapter:")
    cfg = lora_config(tmp, "lora-latent", tmp / f"imported-nemotron_h-latent{LATENT}",
                      ["in_proj", "up_proj", "down_proj"])
    run("--config", cfg, "-q")
    trained = hf_parity.newest_checkpoint(tmp / "run-lora-latent")
    adapter = tmp / "adapter-latent"
    run("export-hf", trained, "--adapter", "--out", adapter)
    peft_logits_match(tmp, cfg, trained, src, adapter, "lora-latent")


def lora_adapter(tmp, src):
    """LoRA over the attention layer's q/k/v/o, the Mamba layers' in_proj and the relu2 experts'
    up / down (PEFT's names under mixer.; the experts as target_parameters), 3 steps ->
    export-hf --adapter -> transformers + PEFT on the source gives moe-train's logits (and not the
    base's: the adapters count). PEFT refuses out_proj on Mamba models: with it in the targets,
    --adapter exits 2 naming it, and --merge gives transformers our logits."""
    print("nemotron_h LoRA (attention, Mamba projections, experts) -> PEFT adapter:")
    cfg = lora_config(tmp, "lora", tmp / "imported-nemotron_h",
                      ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj", "up_proj", "down_proj"])
    run("--config", cfg, "-q")
    trained = hf_parity.newest_checkpoint(tmp / "run-lora")
    adapter = tmp / "adapter"
    run("export-hf", trained, "--adapter", "--out", adapter)
    written = json.loads((adapter / "adapter_config.json").read_text())
    assert sorted(written["target_modules"]) == ["in_proj", "k_proj", "o_proj", "q_proj",
                                                 "v_proj"], written["target_modules"]
    assert written["target_parameters"] == ["mixer.experts.up_proj", "mixer.experts.down_proj"]
    peft_logits_match(tmp, cfg, trained, src, adapter, "lora")
    # out_proj too: no PEFT adapter (exit 2, one line naming it), the merged export instead.
    c = json.loads(cfg.read_text())
    c["lora"]["target_modules"].append("out_proj")
    c["training"]["output_dir"] = str(tmp / "run-lora-out")
    cfg.write_text(json.dumps(c))
    run("--config", cfg, "-q")
    trained = hf_parity.newest_checkpoint(tmp / "run-lora-out")
    p = subprocess.run([BIN, "export-hf", str(trained), "--adapter", "--out", str(tmp / "no-adapter")],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "out_proj" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p
    assert not (tmp / "no-adapter").exists()
    merged = tmp / "merged-out-proj"
    run("export-hf", trained, "--merge", "--out", merged)
    dump = tmp / "logits-lora-out.safetensors"
    r = json.loads(run("eval", "--config", cfg, "--checkpoint", trained, "--dump-logits", dump).stdout)
    compare("LoRA with out_proj, merged export", dump, merged, r["loss"], EXPORT_TOL)


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    run("make-synthetic", "--out", tmp / "data", "--vocab", "320", "--programs", "4", "--doc-len", "33",
        "--train-docs", "800", "--valid-docs", "64")
    src = round_trip(tmp)
    round_trip(tmp, sharded=True)
    pattern_form(tmp, src)
    lora_adapter(tmp, src)
    latent_src = round_trip(tmp, latent=LATENT)
    latent_lora(tmp, latent_src)
print("ok")
