"""Chained fine-tunes keep the imported model's Hugging Face settings (issue: import -> fine-tune
-> fine-tune again -> export-hf lost the tokenizer files and bos/eos ids, wrote
max_position_embeddings 64 for the model's 256, and router_aux_loss_coef 0.01 for its 0.001):

  - every checkpoint descending from an import carries hf_config.json, generation_config.json
    and the tokenizer files;
  - the export of the second fine-tune has the source's max_position_embeddings, token ids,
    router_aux_loss_coef and tokenizer, and transformers loads it;
  - a run config that sets moe.aux_loss_coeff still wins (and the export says so);
  - an import whose max_position_embeddings exceeds the window cap says so (never silent).

usage: hf_lineage_test.py MOE_TRAIN_BINARY"""
import json
import pathlib
import subprocess
import sys
import tempfile

import torch
import transformers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from e2e import Checks  # noqa: E402

BIN = sys.argv[1]
check = Checks()


def run(*args):
    r = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(map(str, args))}: exit {r.returncode}\n{r.stderr[-3000:]}")
    return r


def newest_checkpoint(run_dir):
    cks = [p for p in (run_dir / "checkpoints").iterdir() if (p / "state.json").exists()]
    return max(cks, key=lambda p: json.loads((p / "state.json").read_text())["step"])


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    run("make-synthetic", "--out", tmp / "data", "--vocab", "320", "--programs", "4", "--doc-len", "33",
        "--train-docs", "200", "--valid-docs", "16")
    torch.manual_seed(3)
    hf_cfg = transformers.Qwen3MoeConfig(
        vocab_size=320, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, num_experts=4, moe_intermediate_size=32, intermediate_size=80,
        num_experts_per_tok=2, router_aux_loss_coef=0.001, bos_token_id=5, eos_token_id=6, pad_token_id=0,
        tie_word_embeddings=False)
    src = tmp / "hf"
    transformers.AutoModelForCausalLM.from_config(hf_cfg).save_pretrained(src)
    import tokenizers
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({f"t{i}": i for i in range(320)}, unk_token="t0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(src / "tokenizer.json"))
    (src / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 256}))

    run("import-hf", src, "--out", tmp / "imported")
    cfg = tmp / "ft.json"
    cfg.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 4,
        "data": {"train_path": str(tmp / "data/train.h5")},
        "model": {"seq_len": 32},
        "training": {"train_iters": 4, "eval_interval": 0, "device": "cpu"}}))
    run("--config", cfg, "-q", "--set", f"training.output_dir={tmp / 'ft1'}", "--set", f"model.init_from={tmp / 'imported'}")
    first = newest_checkpoint(tmp / "ft1")
    run("--config", cfg, "-q", "--set", f"training.output_dir={tmp / 'ft2'}", "--set", f"model.init_from={first}")
    second = newest_checkpoint(tmp / "ft2")
    for ck in (first, second):
        check(all((ck / f).exists() for f in ("hf_config.json", "tokenizer.json", "generation_config.json")),
              f"{ck.parent.parent.name}/{ck.name} carries the HF config, generation config and tokenizer")
    saved = json.loads((second / "state.json").read_text())["config"]
    check(saved["moe"]["aux_loss_coeff"] == 0.001, f"the second fine-tune trained with the model's aux coefficient: {saved['moe']['aux_loss_coeff']}")

    run("export-hf", second, "--out", tmp / "exported")
    out = json.loads((tmp / "exported/config.json").read_text())
    check(out["max_position_embeddings"] == 256, f"max_position_embeddings {out['max_position_embeddings']} (256)")
    check(out["router_aux_loss_coef"] == 0.001, f"router_aux_loss_coef {out['router_aux_loss_coef']} (0.001)")
    check(out["bos_token_id"] == 5 and out["eos_token_id"] == 6, f"bos/eos {out.get('bos_token_id')}/{out.get('eos_token_id')}")
    check((tmp / "exported/tokenizer.json").read_text() == (src / "tokenizer.json").read_text(), "the tokenizer travels")
    gen = json.loads((tmp / "exported/generation_config.json").read_text())
    check(gen.get("bos_token_id") == 5 and gen.get("eos_token_id") == 6, f"generation config {gen}")
    _, info = transformers.AutoModelForCausalLM.from_pretrained(tmp / "exported", output_loading_info=True)
    check(not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), f"transformers loads it: {info}")

    # The run's own coefficient wins when it sets one.
    run("--config", cfg, "-q", "--set", f"training.output_dir={tmp / 'ft3'}", "--set", f"model.init_from={first}",
        "--set", "moe.aux_loss_coeff=0.02")
    run("export-hf", newest_checkpoint(tmp / "ft3"), "--out", tmp / "exported3")
    out3 = json.loads((tmp / "exported3/config.json").read_text())
    check(out3["router_aux_loss_coef"] == 0.02, f"a run that sets moe.aux_loss_coeff exports it: {out3['router_aux_loss_coef']}")

    # A long max_position_embeddings: the 2048 window is said, not silent.
    hf_cfg.max_position_embeddings = 40960
    long_src = tmp / "hf-long"
    transformers.AutoModelForCausalLM.from_config(hf_cfg).save_pretrained(long_src)
    r = run("import-hf", long_src, "--out", tmp / "imported-long")
    check("model.seq_len = 2048" in r.stderr and "40960" in r.stderr, f"the window cap is reported: {r.stderr.strip()[-300:]}")
    run("export-hf", tmp / "imported-long", "--out", tmp / "exported-long")
    check(json.loads((tmp / "exported-long/config.json").read_text())["max_position_embeddings"] == 40960,
          "the export keeps max_position_embeddings 40960")

sys.exit(check.exit_code())
