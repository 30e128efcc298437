"""Hugging Face round trip, with transformers as the oracle (tiny random models built locally
from transformers' own config classes; nothing is downloaded):

  for Mixtral, Qwen3-MoE (with a dense layer) and OLMoE, saved as one file and as shards:
    import-hf, then `moe-train eval --dump-logits`: the validation loss equals transformers' on
    the same windows to <= 1e-5 relative and the logits agree to <= 1e-4 max absolute;
    20 training steps from the imported weights (model.init_from), export-hf: transformers loads
    it with no missing, unexpected or mismatched keys and its logits equal moe-train's to
    <= 1e-4; import-hf of the export is bitwise identical to the trained checkpoint.

usage: hf_roundtrip_test.py MOE_TRAIN_BINARY [FAMILY...]
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

from tiny_families import COMMON, FAMILIES  # noqa: E402

BIN = sys.argv[1]
ONLY = sys.argv[2:]
LOGITS_TOL, LOSS_RTOL = 1e-4, 1e-5


run = runner(BIN)  # lora_common: the binary's result, a failure ends the test


def compare(what, dump_path, model_dir, eval_loss):
    hf_parity.compare(what, dump_path, model_dir, eval_loss, LOGITS_TOL, LOSS_RTOL)


def write_tokenizer(d):
    import tokenizers
    vocab = {f"t{i}": i for i in range(320)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))


def family_round_trip(tmp, family, sharded):
    cls, extra = FAMILIES[family]
    tag = f"{family}-{'sharded' if sharded else 'single'}"
    print(f"{tag}:")
    torch.manual_seed(7)
    model = transformers.AutoModelForCausalLM.from_config(cls(**COMMON, **extra))
    src = tmp / f"hf-{tag}"
    if sharded:  # and bf16 on disk: imported into fp32 training weights
        model.to(torch.bfloat16).save_pretrained(src, max_shard_size="40KB")
        assert (src / "model.safetensors.index.json").exists(), "expected a sharded save"
    else:
        model.save_pretrained(src)
    write_tokenizer(src)

    imported = tmp / f"imported-{tag}"
    run("import-hf", src, "--out", imported)
    assert (imported / "tokenizer.json").exists(), "tokenizer files are copied"
    info = json.loads(run("checkpoint", "info", imported).stdout)
    assert "optimizer" not in info and len(info["model"]) > 0, "a weights-only checkpoint"
    cfg = hf_parity.eval_config(tmp, tag)
    dump = tmp / f"logits-{tag}.safetensors"
    r = json.loads(run("eval", "--config", cfg, "--checkpoint", imported, "--dump-logits", dump).stdout)
    compare("imported", dump, src, r["loss"])

    run("--config", cfg, "-q", "--set", f"model.init_from={imported}", "--set", "training.train_iters=20",
        "--set", "training.eval_interval=0", "--set", "optimizer.params.lr=0.003",
        "--set", "scheduler.params.warmup_num_steps=2")
    trained = newest_checkpoint(tmp / f"run-{tag}")
    exported = tmp / f"exported-{tag}"
    run("export-hf", trained, "--out", exported, *(["--max-shard-size", "60KB"] if sharded else []))
    assert (exported / "tokenizer.json").exists(), "tokenizer files travel with the export"
    assert (exported / "model.safetensors.index.json").exists() == sharded
    r2 = hf_parity.exported_matches(run, tmp, tag, cfg, trained, exported, 20, compare)
    assert r2["loss"] < r["loss"], "training from the imported weights lowered the loss"


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    run("make-synthetic", "--out", tmp / "data", "--vocab", "320", "--programs", "4", "--doc-len", "33",
        "--train-docs", "800", "--valid-docs", "64")
    for family in ONLY or FAMILIES:
        for sharded in (False, True):
            family_round_trip(tmp, family, sharded)
print("ok")
