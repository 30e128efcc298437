"""Regenerates the bad-input corpus in this directory (configs/, shards/, datasets/, checkpoints/,
cases.json). The files are committed; rerun only to change them:
  /opt/moe-train/venv/bin/python tests/corpus/make_corpus.py build/src/moe-train"""
import copy
import json
import pathlib
import shutil
import struct
import subprocess
import sys
import tempfile

import h5py
import numpy as np

BIN = sys.argv[1]
HERE = pathlib.Path(__file__).resolve().parent
for sub in ["configs", "shards", "datasets", "checkpoints"]:
    shutil.rmtree(HERE / sub, ignore_errors=True)
    (HERE / sub).mkdir()
cases = []

# The config every case starts from. Paths are placeholders the test fills in at run time.
BASE = {
    "train_batch_size": 4,
    "scheduler": {"type": "Constant"},
    "model": {"vocab_size": 64, "seq_len": 8, "hidden_size": 8, "num_layers": 1, "num_heads": 2},
    "moe": {"num_experts": 2, "top_k": 1, "expert_hidden_size": 8},
    "data": {"train_path": "@GOOD_SHARD@"},
    "training": {"output_dir": "@OUT@", "train_iters": 2},
}
(HERE / "base.json").write_text(json.dumps(BASE, indent=1))


def config_case(name, text, needle, code=2):
    (HERE / "configs" / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    cases.append({"kind": "config", "file": f"configs/{name}", "exit": code, "needle": needle})


def mutate(name, fn, needle):
    c = copy.deepcopy(BASE)
    fn(c)
    config_case(name, json.dumps(c, indent=1), needle)


def put(path, value):
    def f(c):
        node = c
        keys = path.split(".")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return f


# --- configs: syntax ---
good = json.dumps(BASE, indent=1)
config_case("syntax_trailing_comma.json", good.replace('"Constant"', '"Constant",'), "invalid JSON")
config_case("syntax_missing_brace.json", good[:-2], "invalid JSON")
config_case("syntax_single_quotes.json", good.replace('"train_batch_size"', "'train_batch_size'"), "invalid JSON")
config_case("syntax_comment.json", "// comment\n" + good, "invalid JSON")
config_case("syntax_bare_word.json", good.replace("4,", "four,", 1), "invalid JSON")
config_case("empty.json", "", "file is empty")
config_case("whitespace_only.json", "  \n\t\n", "file is empty")
config_case("binary_garbage.json", bytes(range(256)) * 4, "invalid JSON")
config_case("top_level_array.json", "[1, 2, 3]", "expected a JSON object")
config_case("top_level_string.json", '"config"', "expected a JSON object")
config_case("nul_bytes.json", b'{"train_batch_size": 4\x00}', "invalid JSON")
# --- configs: unknown keys ---
mutate("unknown_top.json", put("train_batch_sise", 4), "did you mean 'train_batch_size'")
mutate("unknown_nested.json", put("optimizer.params.lrr", 0.1), "did you mean 'optimizer.params.lr'")
mutate("unknown_section.json", put("modle", {}), "unknown key 'modle'")
mutate("unknown_seed_key.json", put("learning_rate", 1e-4), "did you mean 'optimizer.params.lr'")
mutate("unknown_sched_param.json", lambda c: c.update(scheduler={"type": "WarmupLR", "params": {"cos_min_ratio": 0.1}}),
       "unknown key 'scheduler.params.cos_min_ratio'")
# --- configs: wrong types ---
mutate("type_batch_string.json", put("train_batch_size", "4"), "train_batch_size = \"4\": expected an integer")
mutate("type_lr_string.json", put("optimizer.params.lr", "fast"), "expected a number")
mutate("type_bool_int.json", put("bf16.enabled", 1), "expected true or false")
mutate("type_betas_scalar.json", put("optimizer.params.betas", 0.9), "expected an array of two numbers")
mutate("type_betas_three.json", put("optimizer.params.betas", [0.9, 0.99, 0.999]), "expected an array of two numbers")
mutate("type_model_array.json", put("model", [1, 2]), "model = [1,2]: expected a JSON object")
mutate("type_layers_float.json", put("model.num_layers", 2.5), "expected an integer")
mutate("type_path_number.json", put("data.train_path", 5), "expected a string")
# --- configs: out of range ---
mutate("range_lr_negative.json", put("optimizer.params.lr", -0.001), "optimizer.params.lr = -0.001: must be > 0")
mutate("range_lr_zero.json", put("optimizer.params.lr", 0), "must be > 0")
mutate("range_beta_one.json", put("optimizer.params.betas", [0.9, 1.0]), "must be in [0, 1)")
mutate("range_topk.json", put("moe.top_k", 3), "must be <= moe.num_experts")
mutate("range_topk_over_max.json", lambda c: c["moe"].update(num_experts=128, top_k=65), "moe.top_k = 65: must be in [1, 64]")
mutate("range_dropout.json", put("model.dropout", 1.0), "model.dropout = 1: must be in [0, 1)")
mutate("range_heads.json", put("model.num_heads", 3), "must divide model.hidden_size")
mutate("range_clip.json", put("gradient_clipping", -1), "gradient_clipping = -1")
mutate("range_zero_stage.json", put("zero_optimization.stage", 4), "must be 0, 1, 2 or 3")
mutate("range_port.json", put("monitor.prometheus.port", 70000), "monitor.prometheus.port = 70000")
mutate("range_scale_power.json", put("fp16.initial_scale_power", 99), "must be in [0, 62]")
mutate("range_warmup_negative.json", put("scheduler", {"type": "WarmupLR", "params": {"warmup_num_steps": -5}}),
       "scheduler.params.warmup_num_steps = -5: must be >= 0")
# --- configs: huge numbers ---
config_case("huge_integer.json", good.replace('"train_iters": 2', '"train_iters": 99999999999999999999999'),
            "training.train_iters")
config_case("huge_float.json", good.replace('"train_batch_size": 4', '"train_batch_size": 1e300'),
            "train_batch_size = 1e+300: expected an integer")
# Found by fuzz/fuzz_config.cpp: nlohmann throws out_of_range (not parse_error) for this.
config_case("huge_exponent.json", good.replace('"train_batch_size": 4', '"train_batch_size": 1e3000'),
            "number overflow")
mutate("huge_vocab.json", put("model.vocab_size", 2 ** 40), "model.vocab_size")
# --- configs: inconsistent ---
mutate("inconsistent_batch.json", put("gradient_accumulation_steps", 3), "must be a multiple of gradient_accumulation_steps")
mutate("inconsistent_triple.json", lambda c: c.update(train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=3),
       "must equal train_micro_batch_size_per_gpu (2) x gradient_accumulation_steps (3)")
mutate("inconsistent_batch_div.json", lambda c: c.update(train_batch_size=10, train_micro_batch_size_per_gpu=4),
       "must be a multiple of train_micro_batch_size_per_gpu")
mutate("inconsistent_precision.json", lambda c: c.update(fp16={"enabled": True}, bf16={"enabled": True}),
       "cannot both be enabled")
mutate("inconsistent_data.json", put("data.path", "/nonexistent"), "give data.path or data.train_path, not both")
mutate("inconsistent_no_batch.json", lambda c: c.pop("train_batch_size"), "both missing")
mutate("inconsistent_sched_total.json",
       put("scheduler", {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10, "total_num_steps": 5}}),
       "must be > warmup_num_steps")

# --- shards ---
good_tokens = np.arange(200) % 64


def shard(name, needle, tokens=good_tokens, dtype=np.uint16, attrs=None, dataset="tokens", raw=None):
    path = HERE / "shards" / name
    if raw is not None:
        path.write_bytes(raw)
    else:
        with h5py.File(path, "w") as f:
            f.create_dataset(dataset, data=np.asarray(tokens).astype(dtype))
            for k, v in (attrs if attrs is not None else {"format_version": 1, "vocab_size": 64, "tokenizer": "byte"}).items():
                f.attrs[k] = v
    cases.append({"kind": "shard", "file": f"shards/{name}", "exit": 2, "needle": needle})


shard("good.h5", None)
cases.pop()  # the good shard is the base, not a case
good_bytes = (HERE / "shards/good.h5").read_bytes()
(HERE / "shards/truncated_half.h5").write_bytes(good_bytes[: len(good_bytes) // 2])
cases.append({"kind": "shard", "file": "shards/truncated_half.h5", "exit": 2, "needle": "truncated_half.h5"})
(HERE / "shards/truncated_header.h5").write_bytes(good_bytes[:100])
cases.append({"kind": "shard", "file": "shards/truncated_header.h5", "exit": 2, "needle": "truncated_header.h5"})
shard("not_hdf5.h5", "not an HDF5 file", raw=b"plain text\n" * 50)
shard("empty_file.h5", "not an HDF5 file", raw=b"")
shard("dtype_float.h5", "expected uint16 or uint32", dtype=np.float32)
shard("dtype_int64.h5", "expected uint16 or uint32", dtype=np.int64)
shard("dtype_uint8.h5", "expected uint16 or uint32", dtype=np.uint8)
shard("rank_2.h5", "has rank 2; expected 1", tokens=good_tokens.reshape(20, 10))
shard("no_tokens_dataset.h5", "no dataset named 'tokens'", dataset="ids")
shard("attr_missing_version.h5", "missing attribute 'format_version'", attrs={"vocab_size": 64})
shard("attr_version_2.h5", "format_version = 2", attrs={"format_version": 2, "vocab_size": 64})
shard("attr_vocab_zero.h5", "vocab_size = 0", attrs={"format_version": 1, "vocab_size": 0})
shard("attr_vocab_string.h5", "attribute 'vocab_size' is not an integer", attrs={"format_version": 1, "vocab_size": "64"})
shard("attr_vocab_too_big.h5", "exceeds model.vocab_size", attrs={"format_version": 1, "vocab_size": 1000})
shard("token_out_of_range.h5", "is 64; expected < vocab_size 64", tokens=np.concatenate([good_tokens, [64]]))
shard("shorter_than_window.h5", "one window needs seq_len + 1 = 9", tokens=good_tokens[:5])

# --- datasets with manifests ---
def dataset(name, needle, edit, verify=False):
    d = HERE / "datasets" / name
    d.mkdir()
    shutil.copy(HERE / "shards/good.h5", d / "train-00000.h5")
    import hashlib
    data = (d / "train-00000.h5").read_bytes()
    m = {"format_version": 1, "vocab_size": 64, "tokenizer": "byte",
         "splits": {"train": [{"file": "train-00000.h5", "tokens": 200, "bytes": len(data), "max_token": 63,
                               "documents": 1, "md5": hashlib.md5(data).hexdigest(), "xxh3": ""}]}}
    text = edit(m, d)  # returns the manifest text only for cases that break its syntax
    (d / "manifest.json").write_text(text if name == "manifest_invalid_json" else json.dumps(m))
    cases.append({"kind": "dataset", "file": f"datasets/{name}", "exit": 2, "needle": needle, "verify": verify})


dataset("manifest_invalid_json", "invalid JSON", lambda m, d: "{not json")
dataset("manifest_path_escape", "must be a plain file name",
        lambda m, d: m["splits"]["train"][0].update(file="../../shards/good.h5"))
dataset("manifest_missing_field", "missing 'md5'", lambda m, d: m["splits"]["train"][0].pop("md5"))
dataset("manifest_size_mismatch", "manifest says", lambda m, d: m["splits"]["train"][0].update(bytes=12))
dataset("manifest_no_train", "no 'train' split", lambda m, d: m["splits"].update(valid=m["splits"].pop("train")))
dataset("manifest_missing_shard", "missing (listed in manifest.json)",
        lambda m, d: (d / "train-00000.h5").unlink())
dataset("manifest_checksum_mismatch", "md5", lambda m, d: m["splits"]["train"][0].update(md5="0" * 32), verify=True)
dataset("manifest_max_token", "max_token 70 >= vocab_size 64", lambda m, d: m["splits"]["train"][0].update(max_token=70))

# --- checkpoints: mutate a real one ---
with tempfile.TemporaryDirectory() as t:
    t = pathlib.Path(t)
    c = copy.deepcopy(BASE)
    c["data"]["train_path"] = str(HERE / "shards/good.h5")
    c["training"]["output_dir"] = str(t / "run")
    (t / "c.json").write_text(json.dumps(c))
    subprocess.run([BIN, "--config", t / "c.json", "-q"], check=True, capture_output=True)
    src = t / "run/checkpoints/step-00000002"

    def ckpt(name, needle, edit):
        d = HERE / "checkpoints" / name
        shutil.copytree(src, d)
        edit(d)
        cases.append({"kind": "checkpoint", "file": f"checkpoints/{name}", "exit": 2, "needle": needle})

    def rewrite_header(d, fname, fn):
        raw = (d / fname).read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        h = json.loads(raw[8:8 + n])
        fn(h)
        hb = json.dumps(h).encode()
        (d / fname).write_bytes(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])

    first = lambda h: next(k for k in h if k != "__metadata__")
    ckpt("truncated_model", "model.safetensors", lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:200]))
    ckpt("header_past_eof", "runs past the end", lambda d: (d / "model.safetensors").write_bytes(struct.pack("<Q", 10 ** 9) + b"{}"))
    ckpt("tiny_file", "too short for a header", lambda d: (d / "model.safetensors").write_bytes(b"abc"))
    ckpt("header_not_json", "header is not valid JSON", lambda d: (d / "model.safetensors").write_bytes(struct.pack("<Q", 4) + b"{{{{"))
    ckpt("offsets_out_of_range", "outside the", lambda d: rewrite_header(d, "model.safetensors",
         lambda h: h[first(h)].update(data_offsets=[0, 10 ** 9])))
    ckpt("offsets_overlap", "overlap", lambda d: rewrite_header(d, "model.safetensors",
         lambda h: [h[k].update(data_offsets=[0, h[k]["data_offsets"][1] - h[k]["data_offsets"][0]]) for k in h if k != "__metadata__"]))
    ckpt("wrong_dtype", "the model expects F32", lambda d: rewrite_header(d, "model.safetensors",
         lambda h: h["embed.weight"].update(dtype="I32")))
    ckpt("wrong_shape", "the model expects", lambda d: rewrite_header(d, "model.safetensors",
         lambda h: h["embed.weight"].update(shape=list(reversed(h["embed.weight"]["shape"])))))
    ckpt("unknown_dtype", "unknown dtype", lambda d: rewrite_header(d, "model.safetensors",
         lambda h: h["embed.weight"].update(dtype="F128")))
    ckpt("missing_tensor", "missing tensor 'embed.weight'", lambda d: rewrite_header(d, "model.safetensors",
         lambda h: h.pop("embed.weight")))
    ckpt("missing_optimizer_tensor", "optimizer.safetensors: missing tensor", lambda d: rewrite_header(d, "optimizer.safetensors",
         lambda h: h.pop(first(h))))
    ckpt("state_invalid_json", "state.json: invalid JSON", lambda d: (d / "state.json").write_text("{"))
    ckpt("state_missing", "state.json: missing", lambda d: (d / "state.json").unlink())
    ckpt("state_version", "format_version 99", lambda d: (d / "state.json").write_text(
        json.dumps({**json.loads((d / "state.json").read_text()), "format_version": 99})))
    ckpt("state_missing_field", "state.json", lambda d: (d / "state.json").write_text(
        json.dumps({k: v for k, v in json.loads((d / "state.json").read_text()).items() if k != "loader"})))

    # A checkpoint of a different model (hidden 16): shapes do not match.
    c2 = copy.deepcopy(c)
    c2["model"]["hidden_size"] = 16
    c2["training"]["output_dir"] = str(t / "other")
    (t / "c2.json").write_text(json.dumps(c2))
    subprocess.run([BIN, "--config", t / "c2.json", "-q"], check=True, capture_output=True)
    shutil.copytree(t / "other/checkpoints/step-00000002", HERE / "checkpoints/other_model")
    cases.append({"kind": "checkpoint", "file": "checkpoints/other_model", "exit": 2, "needle": "the model expects"})

(HERE / "cases.json").write_text(json.dumps(cases, indent=1) + "\n")
print(f"{len(cases)} cases")
