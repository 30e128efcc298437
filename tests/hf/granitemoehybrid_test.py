"""Granite 4.0-H against transformers' GraniteMoeHybridForCausalLM (tiny random models built
locally from GraniteMoeHybridConfig with the family's real settings, tests/hf/tiny_families.py;
nothing is downloaded): Mamba-2 and attention layers, each followed by softmax-after-top-k SwiGLU
experts beside a shared MLP, Granite's embedding / residual / logits multipliers and attention
multiplier; attention without positions as released, and with rotary (position_embedding_type
"rope"). Windows of 30 tokens: three whole 8-token chunks of the Mamba scan and a partial one.

  - import-hf (fp32; bf16 shards) -> `eval --dump-logits`: loss within 1e-6 relative of
    transformers, logits within 1e-5;
  - 10 steps of full fine-tuning -> export-hf -> transformers loads it with no missing,
    unexpected or mismatched keys and its logits are within 1e-4 of `eval --dump-logits`;
    import-hf of the export is bitwise identical to the trained checkpoint.

usage: granitemoehybrid_test.py MOE_TRAIN_BINARY
"""
import json
import pathlib
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


def tiny_model(**changes):
    config_class, extra = MAMBA_FAMILIES["granitemoehybrid"]
    torch.manual_seed(19)
    model = transformers.GraniteMoeHybridForCausalLM(config_class(**{**extra, **changes})).eval()
    with torch.no_grad():  # norms at 1, D at 1, dt_bias at 1, A = 1..H: make them count
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.1)
            elif name.endswith(".D") or name.endswith("dt_bias"):
                p.normal_(0.5, 0.5)
            elif name.endswith("A_log"):
                p.uniform_(-1.0, 1.5)
            elif name.endswith("q_proj.weight") or name.endswith("k_proj.weight"):
                p.mul_(12.0)  # peaked attention: where the keys sit (rotary) counts
    return model


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


def round_trip(tmp, tag, sharded=False, **changes):
    print(f"granitemoehybrid {tag}:")
    model = tiny_model(**changes)
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
    assert config["architectures"] == ["GraniteMoeHybridForCausalLM"], config["architectures"]
    assert config["layer_types"] == ["mamba", "attention", "mamba", "mamba"], config["layer_types"]
    check = lambda what, dump, model_dir, loss: compare(what, dump, model_dir, loss, EXPORT_TOL)
    hf_parity.exported_matches(run, tmp, tag, cfg, trained, exported, 10, check)


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    run("make-synthetic", "--out", tmp / "data", "--vocab", "320", "--programs", "4", "--doc-len", "33",
        "--train-docs", "800", "--valid-docs", "64")
    round_trip(tmp, "nope")
    round_trip(tmp, "nope-bf16", sharded=True)
    rope = dict(position_embedding_type="rope", attention_multiplier=0.25,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    with torch.no_grad():  # the rotary changes the logits far beyond the bars below
        x = torch.randint(0, 320, (2, SEQ))
        moved = (tiny_model(**rope)(x).logits - tiny_model(attention_multiplier=0.25)(x).logits)
        print(f"rotary moves the logits by {moved.abs().max().item():.1e}")
        assert moved.abs().max().item() > 100 * LOGITS_TOL
    round_trip(tmp, "rope", **rope)
print("ok")
