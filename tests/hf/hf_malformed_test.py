"""Malformed Hugging Face directories and refused exports: exit 2, one line naming the file and
the tensor or key, and nothing written (no output directory, no partial one).

usage: hf_malformed_test.py MOE_TRAIN_BINARY
"""
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file

BIN = sys.argv[1]
SMALL = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=16, num_local_experts=4,
             num_experts_per_tok=2, max_position_embeddings=32, tie_word_embeddings=False)


def expect_refusal(tmp, what, args, *needles):
    out = tmp / "out"
    r = subprocess.run([BIN, *map(str, args), "--out", out], capture_output=True, text=True)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, f"{what}: exit {r.returncode}, expected 2\n{r.stderr}"
    assert len(lines) == 1, f"{what}: expected one line, got {len(lines)}:\n{r.stderr}"
    for n in needles:
        assert n in lines[0], f"{what}: '{n}' not in: {lines[0]}"
    assert not out.exists(), f"{what}: {out} was written"
    assert not list(tmp.glob("out.partial-*")), f"{what}: a partial directory is left"
    print(f"  {what}: {lines[0]}")


def variant(tmp, base, name):
    d = tmp / name
    shutil.copytree(base, d)
    return d


with tempfile.TemporaryDirectory() as td:
    tmp = pathlib.Path(td)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.MixtralConfig(**SMALL))
    single, sharded = tmp / "single", tmp / "sharded"
    model.save_pretrained(single)
    model.save_pretrained(sharded, max_shard_size="20KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 3, shards
    print("refused imports:")

    d = variant(tmp, sharded, "missing-shard")
    (d / shards[1]).unlink()
    expect_refusal(tmp, "missing shard", ["import-hf", d], shards[1], "missing")

    d = variant(tmp, sharded, "index-names-missing-tensor")
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    idx["weight_map"]["model.layers.0.self_attn.q_proj.weight"] = shards[-1]
    (d / "model.safetensors.index.json").write_text(json.dumps(idx))
    expect_refusal(tmp, "index naming a tensor its shard lacks", ["import-hf", d],
                   "model.layers.0.self_attn.q_proj.weight", shards[-1])

    d = variant(tmp, single, "wrong-shape")
    t = load_file(d / "model.safetensors")
    t["model.layers.1.block_sparse_moe.experts.2.w3.weight"] = torch.zeros(16, 31)
    save_file(t, d / "model.safetensors", metadata={"format": "pt"})
    expect_refusal(tmp, "wrong shape", ["import-hf", d],
                   "model.layers.1.block_sparse_moe.experts.2.w3.weight", "[16, 31]", "[16, 32]")

    d = variant(tmp, single, "missing-tensor")
    t = load_file(d / "model.safetensors")
    del t["model.layers.0.block_sparse_moe.experts.3.w2.weight"]
    save_file(t, d / "model.safetensors", metadata={"format": "pt"})
    expect_refusal(tmp, "missing tensor", ["import-hf", d],
                   "model.layers.0.block_sparse_moe.experts.3.w2.weight", "missing")

    d = variant(tmp, single, "unexpected-tensor")
    t = load_file(d / "model.safetensors")
    t["model.layers.0.block_sparse_moe.experts.4.w1.weight"] = torch.zeros(16, 32)
    save_file(t, d / "model.safetensors", metadata={"format": "pt"})
    expect_refusal(tmp, "unexpected tensor", ["import-hf", d],
                   "model.layers.0.block_sparse_moe.experts.4.w1.weight", "unexpected")

    d = variant(tmp, single, "integer-tensor")
    t = load_file(d / "model.safetensors")
    t["model.norm.weight"] = torch.ones(32, dtype=torch.int64)
    save_file(t, d / "model.safetensors", metadata={"format": "pt"})
    expect_refusal(tmp, "integer weights", ["import-hf", d], "model.norm.weight", "I64")

    d = variant(tmp, single, "unknown-architecture")
    c = json.loads((d / "config.json").read_text())
    c["architectures"] = ["LlamaForCausalLM"]
    (d / "config.json").write_text(json.dumps(c))
    expect_refusal(tmp, "unknown architecture", ["import-hf", d], "LlamaForCausalLM", "config.json")

    # Rotary scalings our attention does not compute (default, linear and yarn it does:
    # hf_rope_scaling_test.py), in transformers 5's rope_parameters and 4.x's rope_scaling.
    for name, key, params, needles in [
        ("dynamic-rope", "rope_parameters", {"rope_type": "dynamic", "rope_theta": 1e6, "factor": 4.0},
         ["rope_parameters.rope_type", "dynamic", "default, linear and yarn"]),
        ("llama3-rope", "rope_scaling", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
         ["rope_scaling.rope_type", "llama3"]),
        ("partial-rope", "rope_parameters", {"rope_type": "default", "rope_theta": 1e4,
                                             "partial_rotary_factor": 0.5},
         ["rope_parameters.partial_rotary_factor", "0.5"]),
        ("shrinking-yarn", "rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4, "factor": 0.5,
                                               "original_max_position_embeddings": 16},
         ["rope_parameters.factor", "0.5", "factor >= 1"]),
        ("linear-without-factor", "rope_scaling", {"type": "linear"}, ["rope_scaling.factor", "missing", "factor >= 1"]),
        # transformers raises KeyError without the key (null derives it from the two windows).
        ("yarn-without-factor", "rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4,
                                                    "original_max_position_embeddings": 16},
         ["rope_parameters.factor", "missing", "null"]),
        ("yarn-reversed-betas", "rope_scaling", {"rope_type": "yarn", "factor": 4.0, "beta_fast": 1.0,
                                                 "beta_slow": 8.0, "original_max_position_embeddings": 16},
         ["rope_scaling.beta_fast", "1.0", "beta_slow"]),
        ("yarn-string-truncate", "rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                                                     "original_max_position_embeddings": 16, "truncate": "no"},
         ["rope_parameters.truncate", "\"no\"", "true, false or null"]),
    ]:
        d = variant(tmp, single, name)
        c = json.loads((d / "config.json").read_text())
        c[key] = params
        (d / "config.json").write_text(json.dumps(c))
        expect_refusal(tmp, name, ["import-hf", d], *needles)

    d = variant(tmp, sharded, "truncated")
    f = d / shards[0]
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    expect_refusal(tmp, "truncated safetensors", ["import-hf", d], shards[0])

    # A tensor stored in two shards: named as such (was "not in model.safetensors.index.json").
    d = variant(tmp, sharded, "tensor-in-two-shards")
    name = next(n for n, f in index["weight_map"].items() if f == shards[0])
    t = load_file(d / shards[1])
    t[name] = load_file(d / shards[0])[name]
    save_file(t, d / shards[1], metadata={"format": "pt"})
    expect_refusal(tmp, "a tensor in two shards", ["import-hf", d], name, "is also in", shards[0], shards[1])

    # A negative dimension in a safetensors header (was "shape holds a non-integer").
    d = variant(tmp, single, "negative-dimension")
    raw = (d / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header["model.norm.weight"]["shape"] = [-32]
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    (d / "model.safetensors").write_bytes(len(h).to_bytes(8, "little") + h + raw[8 + n:])
    expect_refusal(tmp, "a negative dimension", ["import-hf", d], "model.norm.weight", "negative dimension -32")

    # A malformed index file is an hf: error, not a config: one.
    d = variant(tmp, sharded, "malformed-index")
    (d / "model.safetensors.index.json").write_text('{"weight_map": {,}}')
    r = subprocess.run([BIN, "import-hf", d, "--out", tmp / "out"], capture_output=True, text=True)
    line = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    assert r.returncode == 2 and line.startswith("moe-train: error: hf: ") and "model.safetensors.index.json:1:" in line, r.stderr
    print(f"  malformed index: {line}")

    d = variant(tmp, single, "no-config")
    (d / "config.json").unlink()
    expect_refusal(tmp, "no config.json", ["import-hf", d], "config.json")

    # An existing non-empty output directory is never touched.
    out = tmp / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    r = subprocess.run([BIN, "import-hf", single, "--out", out], capture_output=True, text=True)
    assert r.returncode == 2 and "not empty" in r.stderr, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    shutil.rmtree(out)

    print("refused exports:")
    data = tmp / "data"
    subprocess.run([BIN, "make-synthetic", "--out", data, "--vocab", "64", "--programs", "2",
                    "--doc-len", "17", "--train-docs", "64", "--valid-docs", "8"], check=True,
                   capture_output=True)
    base = ["--set", "train_micro_batch_size_per_gpu=2", "--set", "training.train_iters=1",
            "--set", "training.device=cpu", "--set", f"data.train_path={data}/train.h5",
            "--set", f"data.valid_path={data}/valid.h5", "--set", "model.hidden_size=32",
            "--set", "model.num_layers=1", "--set", "model.num_heads=2", "--set", "model.seq_len=16",
            "--set", "model.vocab_size=128", "--set", "moe.num_experts=4"]
    cfg = tmp / "c.json"
    cfg.write_text("{}")
    def train_one(name, sets):
        run_dir = tmp / f"run-{name}"
        args = [BIN, "--config", cfg, "-q", *base, "--set", f"training.output_dir={run_dir}"]
        for s in sets:
            args += ["--set", s]
        r = subprocess.run(args, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return next(p for p in (run_dir / "checkpoints").iterdir() if (p / "state.json").exists())

    expect_refusal(tmp, "export of learned positions", ["export-hf", train_one("learned", [])],
                   "model.rope_theta")
    expect_refusal(tmp, "export of a sigmoid router",
                   ["export-hf", train_one("sigmoid", ["model.rope_theta=10000",
                                                       "moe.score_function=sigmoid"])],
                   "moe.shared_expert_hidden_size", "GLM-4.5")
    rope = train_one("rope", ["model.rope_theta=10000"])
    expect_refusal(tmp, "export as Qwen3-MoE without q/k norms",
                   ["export-hf", rope, "--architecture", "Qwen3MoeForCausalLM"], "model.qk_norm")
    expect_refusal(tmp, "export with a bad shard size",
                   ["export-hf", rope, "--max-shard-size", "5XB"], "--max-shard-size", "5XB")

    print("init_from contradicting the config:")
    imported = tmp / "imported"
    subprocess.run([BIN, "import-hf", single, "--out", imported], check=True, capture_output=True)
    r = subprocess.run([BIN, "--config", cfg, "-q", *base, "--set", f"model.init_from={imported}",
                        "--set", f"training.output_dir={tmp / 'run-init'}"], capture_output=True, text=True)
    line = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(line) == 1 and "contradicts" in line[0], r.stderr
    assert not (tmp / "run-init").exists(), "nothing written"
    print(f"  {line[0]}")
print("ok")
