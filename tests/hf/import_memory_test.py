"""Streaming import: `moe-train import-hf` of a ~1.1 GB sharded Qwen3-MoE (280 M parameters,
fp32, 8 shards; built locally from transformers' config class) peaks at most LibTorch's
baseline + 3 x the largest tensor in resident memory (GNU time's "Maximum resident set size"),
i.e. it never holds the model: each of our parameters is assembled from its mapped HF tensors,
appended to the checkpoint and freed. The baseline is the same binary failing on a missing
directory after LibTorch has loaded.

usage: import_memory_test.py MOE_TRAIN_BINARY
"""
import pathlib
import sys
import tempfile

import torch
import transformers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from one_gb_model import one_gb_qwen3_moe_config, peak_rss_bytes as _peak  # noqa: E402

BIN = sys.argv[1]


def peak_rss_bytes(*args):
    return _peak(BIN, *args)


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    torch.manual_seed(0)
    cfg = one_gb_qwen3_moe_config()
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    model.save_pretrained(tmp / "hf", max_shard_size="200MB")
    del model

    rc, baseline, err = peak_rss_bytes("import-hf", tmp / "missing", "--out", tmp / "never")
    assert rc == 2, err
    rc, peak, err = peak_rss_bytes("import-hf", tmp / "hf", "--out", tmp / "imported")
    assert rc == 0, err
    bound = baseline + 3 * largest
    mib = lambda b: f"{b / 2**20:.0f} MiB"
    print(f"model {mib(total)} in {len(list((tmp / 'hf').glob('*.safetensors')))} shards, largest "
          f"tensor {mib(largest)}; import-hf peak RSS {mib(peak)}; LibTorch baseline {mib(baseline)}; "
          f"bound baseline + 3 x largest = {mib(bound)}")
    assert peak <= bound, f"import-hf peaked at {mib(peak)} > {mib(bound)}"
    print("ok")
