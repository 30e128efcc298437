"""Scaled rotary embeddings (transformers' rope types linear and yarn), with transformers as the
oracle, on windows 4x past the pretraining one (tiny random models built locally; nothing is
downloaded):

  each family with the scaling as transformers 5 saves it (rope_parameters) and as a user adds it
  to a config.json by hand (rope_scaling, Qwen3's long-context recipe): import-hf, then
  `moe-train eval --dump-logits` at 64 tokens: loss within 1e-5 relative and logits within 1e-4
  of transformers', which must itself be running the scaled rope type;
  YaRN with its defaults, with beta_fast/beta_slow/attention_factor/truncate given, with
  DeepSeek's mscale/mscale_all_dim, and with factor and truncate null (transformers derives the
  factor from the two windows and, null being falsy, does not truncate: checked to matter);
  a round trip (train from the import, export-hf, transformers loads it with the same scaling and
  the same logits and no rope warning, import-hf of the export is bitwise the trained weights and
  the same scaling; the 4.x rope_scaling copy holds only keys 4.x knows);
  a long-context fine-tune: an unscaled import trained with model.rope_scaling set in the run's
  config; the export carries the scaling and max_position_embeddings = factor x original (which
  some 4.x releases derive the factor from; 5.x warns otherwise), and `eval` without it in the
  config inherits it;
  the same with LoRA: `export-hf --adapter` warns that the PEFT adapter carries no config and
  names the rope_parameters to load the base with; loaded so, base + adapter give our logits.

usage: hf_rope_scaling_test.py MOE_TRAIN_BINARY
"""
import contextlib
import json
import logging
import pathlib
import subprocess
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file

from tiny_families import COMMON, FAMILIES

BIN = sys.argv[1]
LOGITS_TOL, LOSS_RTOL = 1e-4, 1e-5
WINDOW = 64  # the evaluation window; the yarn models were "pretrained" at 8 or 16

YARN = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 16}
CASES = [
    # tag, family, where the scaling is written, the scaling
    ("qwen3-yarn", "qwen3_moe", "rope_parameters", YARN),
    ("olmoe-yarn-tuned", "olmoe", "rope_parameters",
     {"rope_type": "yarn", "rope_theta": 5e5, "factor": 8.0, "original_max_position_embeddings": 8,
      "beta_fast": 16.0, "beta_slow": 2.0, "attention_factor": 1.25, "truncate": False}),
    ("mixtral-yarn-mscale", "mixtral", "rope_parameters", dict(YARN, mscale=0.707, mscale_all_dim=1.0)),
    ("mixtral-linear-by-hand", "mixtral", "rope_scaling", {"type": "linear", "factor": 2.0}),
    ("qwen3-yarn-by-hand", "qwen3_moe", "rope_scaling",
     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
    ("qwen3-yarn-nulls", "qwen3_moe", "rope_parameters",
     # theta and window chosen so the ramp's upper end (1.41 dimensions) is not an integer: the
     # truncation check below must see a difference
     {"rope_type": "yarn", "rope_theta": 1e4, "factor": None, "original_max_position_embeddings": 32,
      "truncate": None}),
]


@contextlib.contextmanager
def rope_warnings():
    """Collects what transformers logs about the rotary settings while the block runs."""
    got = []

    class Collect(logging.Handler):
        def emit(self, record):
            message = record.getMessage()
            if "rope" in message.lower():
                got.append(message)

    handler, logger = Collect(), logging.getLogger("transformers")
    # At least warnings, whatever the environment's verbosity; and warning_once's per-process
    # cache cleared, so a message logged earlier in this process is logged again here.
    transformers.logging.set_verbosity_warning()
    logging.Logger.warning_once.cache_clear()
    logger.addHandler(handler)
    try:
        yield got
    finally:
        logger.removeHandler(handler)


def run(*args):
    r = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(map(str, args))}: exit {r.returncode}\n{r.stderr[-3000:]}")
    return r


def hf_model(model_dir, rope_type):
    m = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    got = m.model.rotary_emb.rope_type
    assert got == rope_type, f"{model_dir}: transformers runs rope type {got}, expected {rope_type}"
    return m


def compare(what, dump_path, model_dir, eval_loss, rope_type):
    d = load_file(dump_path)
    windows, ours = d["tokens"], d["logits"]
    assert windows.shape[1] - 1 == WINDOW, f"{what}: windows of {windows.shape[1] - 1} tokens"
    with torch.no_grad():
        theirs = hf_model(model_dir, rope_type)(input_ids=windows[:, :-1]).logits
    diff = (theirs - ours).abs().max().item()
    loss = torch.nn.functional.cross_entropy(theirs.double().reshape(-1, theirs.shape[-1]),
                                             windows[:, 1:].reshape(-1)).item()
    rel = abs(loss - eval_loss) / abs(loss)
    print(f"  {what}: {windows.shape[0]} windows x {WINDOW} tokens: max |logit diff| {diff:.2e}, "
          f"loss transformers {loss:.7f} moe-train {eval_loss:.7f} (rel {rel:.1e})")
    assert diff <= LOGITS_TOL, f"{what}: logits differ by {diff}"
    assert rel <= LOSS_RTOL, f"{what}: loss differs by {rel} relative"


def checkpoint_scaling(ckpt):
    return json.loads((ckpt / "state.json").read_text())["config"]["model"].get("rope_scaling")


def newest_checkpoint(run_dir):
    cks = sorted(p for p in (run_dir / "checkpoints").iterdir() if (p / "state.json").exists())
    return max(cks, key=lambda p: json.loads((p / "state.json").read_text())["step"])


def save_family(tmp, tag, family, where, scaling):
    cls, extra = FAMILIES[family]
    torch.manual_seed(11)
    kwargs = dict(COMMON, **extra)
    if where == "rope_parameters":
        kwargs["rope_parameters"] = dict(scaling)
    if family == "mixtral":
        # transformers 5.24's YaRN reads getattr(config, "head_dim", ...), which MixtralConfig
        # holds as None unless given: without it transformers itself cannot build the model.
        kwargs["head_dim"] = COMMON["hidden_size"] // COMMON["num_attention_heads"]
    model = transformers.AutoModelForCausalLM.from_config(cls(**kwargs))
    src = tmp / f"hf-{tag}"
    model.save_pretrained(src)
    if where == "rope_scaling":  # what a user adds to a saved config.json by hand
        c = json.loads((src / "config.json").read_text())
        c["rope_scaling"] = scaling
        c["rope_theta"] = 1e6
        (src / "config.json").write_text(json.dumps(c, indent=2))
    return src


def eval_config(tmp, tag, model=None):
    cfg = tmp / f"eval-{tag}.json"
    cfg.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 2,
        "data": {"train_path": str(tmp / "data/train.h5"), "valid_path": str(tmp / "data/valid.h5")},
        "model": dict({"seq_len": WINDOW}, **(model or {})),
        "training": {"eval_iters": 4, "device": "cpu", "output_dir": str(tmp / f"run-{tag}")}}))
    return cfg


def evaluate(tmp, cfg, ckpt, name):
    dump = tmp / f"logits-{name}.safetensors"
    r = json.loads(run("eval", "--config", cfg, "--checkpoint", ckpt, "--dump-logits", dump).stdout)
    return dump, r


def train(cfg, init_from):
    run("--config", cfg, "-q", "--set", f"model.init_from={init_from}", "--set", "training.train_iters=10",
        "--set", "training.eval_interval=0", "--set", "optimizer.params.lr=0.003",
        "--set", "scheduler.params.warmup_num_steps=2")


def imported_case(tmp, tag, family, where, scaling):
    print(f"{tag}:")
    src = save_family(tmp, tag, family, where, scaling)
    rope_type = scaling.get("rope_type", scaling.get("type"))
    imported = tmp / f"imported-{tag}"
    run("import-hf", src, "--out", imported)
    ours = checkpoint_scaling(imported)
    assert ours and ours["type"] == rope_type, f"{tag}: imported model.rope_scaling = {ours}"
    factor = scaling["factor"] or COMMON["max_position_embeddings"] / scaling["original_max_position_embeddings"]
    assert ours["factor"] == factor, f"{tag}: factor {ours['factor']}, expected {factor}"
    if "truncate" in scaling:
        assert ours["truncate"] == bool(scaling["truncate"]), f"{tag}: truncate {ours['truncate']}"
    dump, r = evaluate(tmp, eval_config(tmp, tag), imported, tag)
    compare("imported", dump, src, r["loss"], rope_type)
    if "truncate" in scaling:  # the case must tell truncation apart, or it proves nothing
        flipped = dict(scaling, truncate=not scaling["truncate"])
        other = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32,
                                                                  rope_parameters=flipped).eval()
        d = load_file(dump)
        with torch.no_grad():
            gap = (other(input_ids=d["tokens"][:, :-1]).logits - d["logits"]).abs().max().item()
        print(f"  with truncate={flipped['truncate']} transformers differs from us by {gap:.2e}")
        assert gap > 10 * LOGITS_TOL, f"{tag}: truncation changes the logits by only {gap}"
    return src, imported, ours


def round_trip(tmp, tag, imported, scaling):
    print(f"{tag}, trained and exported:")
    cfg = eval_config(tmp, tag + "-train")
    train(cfg, imported)
    trained = newest_checkpoint(tmp / f"run-{tag}-train")
    exported = tmp / f"exported-{tag}"
    run("export-hf", trained, "--out", exported)
    written = json.loads((exported / "config.json").read_text())
    rp = written["rope_parameters"]
    assert rp["rope_type"] == "yarn" and rp["factor"] == 4.0 and rp["original_max_position_embeddings"] == 16, rp
    # transformers 4.x reads rope_scaling and warns about keys it does not know (rope_theta, and
    # truncate, which is left out where it is the default).
    legacy = {k: v for k, v in rp.items() if k not in ("rope_theta", "truncate")}
    assert written["rope_scaling"] == legacy, f"rope_scaling {written['rope_scaling']}, expected {legacy}"
    assert written["rope_theta"] == rp["rope_theta"]
    with rope_warnings() as warned:
        _, info = transformers.AutoModelForCausalLM.from_pretrained(exported, output_loading_info=True)
    assert not warned, f"{tag}: transformers warns about the exported rope settings: {warned}"
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        assert not info[k], f"{tag}: transformers reports {k}: {info[k]}"
    dump, r = evaluate(tmp, cfg, trained, tag + "-trained")
    compare("trained 10 steps, exported", dump, exported, r["loss"], "yarn")
    again = tmp / f"reimported-{tag}"
    run("import-hf", exported, "--out", again)
    assert checkpoint_scaling(again) == checkpoint_scaling(trained) == scaling, "scaling kept"
    a, b = load_file(trained / "model.safetensors"), load_file(again / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "weights bitwise"
    print(f"  import-hf of the export: {len(a)} tensors bitwise, model.rope_scaling the same")


def long_context_fine_tune(tmp):
    tag = "qwen3-long-context"
    print(f"{tag}: an unscaled import fine-tuned with yarn set in the run's config:")
    src = save_family(tmp, tag, "qwen3_moe", "none", None)
    imported = tmp / f"imported-{tag}"
    run("import-hf", src, "--out", imported)
    assert checkpoint_scaling(imported) in (None, {}) or checkpoint_scaling(imported)["type"] == "none"
    # factor x original (128) past the base's max_position_embeddings (64): the export says so.
    scaling = {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16}
    train(eval_config(tmp, tag, {"rope_scaling": scaling}), imported)
    trained = newest_checkpoint(tmp / f"run-{tag}")
    assert checkpoint_scaling(trained)["type"] == "yarn"
    exported = tmp / f"exported-{tag}"
    run("export-hf", trained, "--out", exported)
    written = json.loads((exported / "config.json").read_text())
    assert written["max_position_embeddings"] == 128, written["max_position_embeddings"]
    with rope_warnings() as warned:
        transformers.AutoConfig.from_pretrained(exported)
    assert not warned, f"{tag}: transformers warns about the exported rope settings: {warned}"
    # eval's config leaves model.rope_scaling out: it comes with the checkpoint's architecture.
    dump, r = evaluate(tmp, eval_config(tmp, tag + "-eval"), trained, tag)
    compare("fine-tuned, exported", dump, exported, r["loss"], "yarn")


def lora_long_context(tmp):
    """LoRA on the unscaled base with yarn set in the run's config: the PEFT adapter carries no
    config, so export-hf --adapter says how to load the base; following it gives our logits."""
    import re
    import peft
    tag = "qwen3-lora-long-context"
    print(f"{tag}: LoRA with yarn in the run's config, exported as a PEFT adapter:")
    src = tmp / "hf-qwen3-long-context"  # the unscaled model long_context_fine_tune saved
    cfg = tmp / f"cfg-{tag}.json"
    # factor x original = 128, twice the base's max_position_embeddings: the hint must carry it.
    scaling = {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16}
    cfg.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 2,
        "lora": {"r": 4, "lora_alpha": 8,
                 "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]},
        "model": {"seq_len": WINDOW, "init_from": str(src), "rope_scaling": scaling},
        "data": {"train_path": str(tmp / "data/train.h5"), "valid_path": str(tmp / "data/valid.h5")},
        "training": {"eval_iters": 4, "device": "cpu", "output_dir": str(tmp / f"run-{tag}"),
                     "train_iters": 10, "eval_interval": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}}))
    run("--config", cfg, "-q")
    trained = newest_checkpoint(tmp / f"run-{tag}")
    adapter = tmp / f"adapter-{tag}"
    err = run("export-hf", trained, "--adapter", "--out", adapter).stderr
    found = re.search(r"from_pretrained\(BASE, rope_parameters=(\{.*?\}), max_position_embeddings=(\d+)\)",
                      err)
    assert found and "--merge" in err, f"export-hf --adapter says nothing about the scaling:\n{err}"
    rope_parameters, window = json.loads(found.group(1)), int(found.group(2))
    assert rope_parameters["rope_type"] == "yarn" and window == 128, (rope_parameters, window)
    print(f"  export-hf --adapter: {err.strip().splitlines()[-1][:160]}...")
    # No warning when the base has the scaling the adapters were trained with: LoRA on the yarn
    # model, its run config silent on the scaling (inherited from the base).
    inherited = json.loads(cfg.read_text())
    inherited["model"] = {"seq_len": WINDOW, "init_from": str(tmp / "hf-qwen3-yarn")}
    inherited["training"]["output_dir"] = str(tmp / f"run-{tag}-inherited")
    cfg2 = tmp / f"cfg-{tag}-inherited.json"
    cfg2.write_text(json.dumps(inherited))
    run("--config", cfg2, "-q", "--set", "training.train_iters=2")
    trained2 = newest_checkpoint(tmp / f"run-{tag}-inherited")
    assert checkpoint_scaling(trained2)["type"] == "yarn", "the base's scaling is inherited"
    quiet = run("export-hf", trained2, "--adapter", "--out", tmp / f"adapter-{tag}-inherited").stderr
    assert "rope_parameters=" not in quiet, quiet
    dump, _ = evaluate(tmp, cfg, trained, tag)  # a LoRA checkpoint evaluates with its run's config
    d = load_file(dump)
    base = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32,
                                                             rope_parameters=rope_parameters,
                                                             max_position_embeddings=window)
    model = peft.PeftModel.from_pretrained(base, adapter).eval()
    with torch.no_grad():
        theirs = model(input_ids=d["tokens"][:, :-1]).logits
    diff = (theirs - d["logits"]).abs().max().item()
    print(f"  base loaded as the warning says + the PEFT adapter: max |logit diff| {diff:.2e}")
    assert diff <= LOGITS_TOL, f"{tag}: logits differ by {diff}"


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    run("make-synthetic", "--out", tmp / "data", "--vocab", "320", "--programs", "4", "--doc-len", "65",
        "--train-docs", "400", "--valid-docs", "16")
    for case in CASES:
        _, imported, scaling = imported_case(tmp, *case)
        if case[0] == "qwen3-yarn":
            round_trip(tmp, case[0], imported, scaling)
    long_context_fine_tune(tmp)
    lora_long_context(tmp)
print("ok")
