#!/usr/bin/env python3
"""LoRA over a 4-bit frozen base (quantization.load_in_4bit), with bitsandbytes, transformers and
PEFT as the oracles (tiny random models built locally from transformers' config classes; nothing
is downloaded). For Qwen3-MoE (with a dense layer) and Mixtral, nf4 with double quant and fp4
without:

  1. the peer: the transformers model with every matrix we quantize (q/k/v/o, the dense MLP's
     gate/up/down, and each expert's gate, up and down matrix cut from the 3-D stacks as the
     per-expert nn.Linear weights [out, in]) replaced by bitsandbytes' dequantization of its
     quantization, in fp32; embeddings, norms, routers and the head untouched;
  2. moe-train trains LoRA (r 4 on attention and experts) with init_from = the original HF
     directory and the quantization section: `eval --dump-logits` of its step-0 checkpoint (the
     adapters add nothing yet) is within 1e-5 of the peer's logits;
  3. 20 AdamW steps of PEFT over the peer (float64, the same adapters at step 0, batches,
     learning rates and clipping): per-step losses within 1e-5 relative, final adapters within
     1e-5;
  4. the checkpoints hold adapters only and record the base's fingerprint (which covers the
     4-bit codes): eval with a config without lora / quantization sections takes both from the
     checkpoint and gives the same loss.

usage: qlora_test.py MOE_TRAIN_BINARY [FAMILY...]
"""
import json
import pathlib
import sys
import tempfile
import warnings

import peft
import torch
import transformers
from safetensors.torch import load_file

warnings.filterwarnings("ignore")
import bitsandbytes.functional as bnbf  # noqa: E402
import bitsandbytes.backends.utils as bnb_utils  # noqa: E402
from bitsandbytes.backends.default import ops as bnb_default  # noqa: E402

DEQUANTIZE_4BIT = getattr(bnb_default._dequantize_4bit_compute, "__wrapped__",
                          bnb_default._dequantize_4bit_compute)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "hf"))
from tiny_families import COMMON, FAMILIES  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from lora_common import checkpoint, peft_steps, runner  # noqa: E402

BIN = sys.argv[1]
ONLY = sys.argv[2:]
STEPS, BATCH, SEQ = 20, 8, 32
LOSS_RTOL, TENSOR_TOL, LOGITS_TOL = 1e-5, 1e-5, 1e-5
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
VARIANTS = [("nf4", True), ("fp4", False)]

run = runner(BIN)


def roundtrip(w, quant_type, dq):
    """bitsandbytes' dequantization of its own 4-bit quantization of one [out, in] matrix: its
    portable implementation (tests/quant/bnb_4bit_test.py says why not its AVX-512 kernel, which
    gets the scales wrong for rows of 32 or 80 values such as these down projections')."""
    q, st = bnbf.quantize_4bit(w.float().contiguous(), blocksize=64, compress_statistics=dq,
                               quant_type=quant_type)
    absmax = bnbf.dequantize_blockwise(st.absmax, st.state2) + st.offset if dq else st.absmax
    code = bnb_utils._get_4bit_code(quant_type, w.device)
    return DEQUANTIZE_4BIT(q.reshape(-1), absmax.float(), code, 64, list(w.shape), torch.float32)


def roundtrip_experts(model, quant_type, dq):
    """Each expert's gate, up and down matrix of transformers' 3-D stacks ([E, out, in]; gate_up
    holds gate's rows then up's) replaced by bitsandbytes' round trip, in place. Returns how many."""
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not (name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj")):
                continue
            f = p.shape[1] // 2
            for e in range(p.shape[0]):
                parts = [p[e, :f], p[e, f:]] if name.endswith("gate_up_proj") else [p[e]]
                for m in parts:
                    m.copy_(roundtrip(m, quant_type, dq))
                    n += 1
    return n


def dequantized_peer(src, dst, quant_type, dq):
    m = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    n = 0
    with torch.no_grad():
        for name, p in m.named_parameters():
            if any(f".self_attn.{k}.weight" in name for k in ("q_proj", "k_proj", "v_proj",
                                                               "o_proj")) or \
                    any(f".mlp.{k}.weight" in name for k in ("gate_proj", "up_proj", "down_proj")):
                p.copy_(roundtrip(p, quant_type, dq))
                n += 1
    n += roundtrip_experts(m, quant_type, dq)
    m.save_pretrained(dst)
    return n


def config(tmp, tag, src, out, quant_type, dq):
    cfg = {
        "train_micro_batch_size_per_gpu": BATCH,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                   "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 3}},
        "gradient_clipping": 1.0,
        "lora": {"r": 4, "lora_alpha": 8, "target_modules": TARGETS},
        "quantization": {"load_in_4bit": True, "bnb_4bit_quant_type": quant_type,
                         "bnb_4bit_use_double_quant": dq, "bnb_4bit_compute_dtype": "float32"},
        "model": {"seq_len": SEQ, "init_from": str(src)},
        "moe": {"aux_loss_coeff": 0.0, "z_loss_coeff": 0.0},
        "data": {"train_path": str(tmp / "data/train.h5"), "valid_path": str(tmp / "data/valid.h5"),
                 "shuffle": False},
        "training": {"device": "cpu", "output_dir": str(out), "train_iters": STEPS,
                     "eval_interval": 0, "eval_iters": 2},
        "checkpoint": {"save_initial": True},
    }
    path = tmp / f"cfg-{tag}.json"
    path.write_text(json.dumps(cfg))
    return path


def peft_training(tmp, peer, adapter0, ours, base=None):
    """20 AdamW steps of PEFT over `peer` (a directory, in float64) or over `base` (a model as
    given); returns the adapter state dict."""
    if base is None:
        base = transformers.AutoModelForCausalLM.from_pretrained(peer, dtype=torch.float64,
                                                                 experts_implementation="eager")
    m = peft.PeftModel.from_pretrained(base, adapter0, is_trainable=True)
    return peft_steps(m, tmp / "data/train.h5", ours, STEPS, BATCH, SEQ, LOSS_RTOL)


def family_test(tmp, family, quant_type, dq):
    cls, extra = FAMILIES[family]
    tag = f"{family}-{quant_type}-{int(dq)}"
    print(f"{family}, {quant_type}, double quant {dq}:")
    torch.manual_seed(11)
    src = tmp / f"hf-{family}"
    if not src.exists():
        transformers.AutoModelForCausalLM.from_config(cls(**COMMON, **extra)).save_pretrained(src)
    peer = tmp / f"peer-{tag}"
    n = dequantized_peer(src, peer, quant_type, dq)
    out = tmp / f"run-{tag}"
    cfg = config(tmp, tag, src, out, quant_type, dq)
    r = run("--config", cfg)
    assert "4-bit base" in r.stderr, r.stderr[-1500:]
    ours = [json.loads(l) for l in open(out / "metrics.jsonl")]
    ours = [m for m in ours if m["type"] == "train"]
    assert len(ours) == STEPS

    dump = tmp / f"logits-{tag}.safetensors"
    res = json.loads(run("eval", "--config", cfg, "--checkpoint", checkpoint(out, 0),
                         "--dump-logits", dump).stdout)
    d = load_file(dump)
    hf = transformers.AutoModelForCausalLM.from_pretrained(peer, dtype=torch.float32)
    with torch.no_grad():
        theirs = hf.eval()(input_ids=d["tokens"][:, :-1]).logits
    diff = (theirs - d["logits"]).abs().max().item()
    print(f"  {n} matrices quantized; step-0 logits vs transformers over bitsandbytes' "
          f"dequantized weights: max |diff| {diff:.1e} (eval loss {res['loss']:.5f})")
    assert diff <= LOGITS_TOL, diff

    adapter0 = tmp / f"adapter0-{tag}"
    run("export-hf", checkpoint(out, 0), "--adapter", "--out", adapter0)
    theirs = peft_training(tmp, peer, adapter0, ours)
    adapter = tmp / f"adapter-{tag}"
    run("export-hf", checkpoint(out, STEPS), "--adapter", "--out", adapter)
    mine = load_file(adapter / "adapter_model.safetensors")
    assert mine.keys() == theirs.keys(), f"adapter names: {sorted(mine)[:4]} vs {sorted(theirs)[:4]}"
    worst = max((mine[k].double() - theirs[k].detach()).abs().max().item() for k in mine)
    print(f"  final adapter: {len(mine)} tensors, max |diff| vs PEFT {worst:.1e}")
    assert worst <= TENSOR_TOL, worst

    held = load_file(checkpoint(out, STEPS) / "model.safetensors")
    assert all(".lora_" in k for k in held), f"checkpoint holds base tensors: {sorted(held)[:3]}"
    state = json.loads((checkpoint(out, STEPS) / "state.json").read_text())
    assert state["lora_base_fingerprint"], "the base fingerprint is recorded"
    plain = json.loads(pathlib.Path(cfg).read_text())
    plain.pop("lora")
    plain.pop("quantization")
    plain["model"].pop("init_from")
    plain_cfg = tmp / f"cfg-plain-{tag}.json"
    plain_cfg.write_text(json.dumps(plain))
    a = json.loads(run("eval", "--config", cfg, "--checkpoint", checkpoint(out, STEPS)).stdout)
    b = json.loads(run("eval", "--config", plain_cfg, "--checkpoint", checkpoint(out, STEPS)).stdout)
    assert a["loss"] == b["loss"], (a["loss"], b["loss"])
    print(f"  eval without lora / quantization sections: loss {b['loss']:.5f}, the same")


def resume_and_other_quantization(tmp):
    """Qwen3-MoE nf4 + double quant: 10 + 10 steps with a resume equal 20 straight bitwise (the
    base is quantized again on the restart, to the same codes); resuming under fp4 is another
    base (the fingerprint covers the codes): exit 2 naming it."""
    print("qwen3_moe: resume over a 4-bit base, and a resume under another quantization:")
    src = tmp / "hf-qwen3_moe"
    full, split = tmp / "run-4bit-20", tmp / "run-4bit-10-10"
    run("--config", config(tmp, "4bit-20", src, full, "nf4", True), "-q")
    cfg = config(tmp, "4bit-10-10", src, split, "nf4", True)
    c = json.loads(cfg.read_text())
    c["training"]["exit_interval"] = 10
    cfg.write_text(json.dumps(c))
    run("--config", cfg, "-q")
    assert not checkpoint(split, STEPS).exists()
    run("--config", cfg, "-q")
    for f in ("model.safetensors", "optimizer.safetensors"):
        a, b = load_file(checkpoint(full, STEPS) / f), load_file(checkpoint(split, STEPS) / f)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f"{f} differs"
    print("  20 steps straight == 10 + 10 resumed, bitwise (adapters and Adam state)")
    # init_from the moe-train checkpoint import-hf writes (the docs' path): the same 4-bit base.
    imported = tmp / "base-qwen3_moe-imported"
    run("import-hf", src, "--out", imported)
    via = tmp / "run-4bit-imported"
    c = json.loads(config(tmp, "4bit-imported", imported, via, "nf4", True).read_text())
    c["training"]["train_iters"] = 1
    (tmp / "cfg-4bit-imported.json").write_text(json.dumps(c))
    run("--config", tmp / "cfg-4bit-imported.json", "-q")
    fp = [json.loads((checkpoint(d, 0) / "state.json").read_text())["lora_base_fingerprint"]
          for d in (full, via)]
    assert fp[0] == fp[1], fp
    print("  init_from the import-hf checkpoint: the same 4-bit base (fingerprint) as from the HF directory")
    other = config(tmp, "4bit-fp4", src, split, "fp4", False)
    c = json.loads(other.read_text())
    c["training"]["train_iters"] = 30
    other.write_text(json.dumps(c))
    r = run("--config", other, ok=False)
    assert r.returncode == 2 and "different base model" in r.stderr and "(fp4)" in r.stderr \
        and "(nf4, double quant)" in r.stderr, (r.returncode, r.stderr[-800:])
    print(f"  resume under fp4: exit 2: {r.stderr.strip().splitlines()[-1][:150]}...")


def bnb_saved_checkpoint(tmp):
    """A checkpoint that transformers + bitsandbytes saved in 4 bits (attention quantized; the
    3-D experts left in full precision, as transformers 5 does, bitsandbytes#1849) loads as it
    is: its codes are kept (the merged export's q/k/v/o are bitsandbytes' dequantization of the
    saved states, bitwise), the experts are quantized by us, and eval's logits and loss match
    transformers running the saved model (its Linear4bit layers) with the experts replaced by
    bitsandbytes' dequantization of their quantization."""
    print("mixtral saved by transformers + bitsandbytes (nf4, double quant):")
    cls, extra = FAMILIES["mixtral"]
    torch.manual_seed(12)
    src, saved = tmp / "hf-bnb-src", tmp / "hf-bnb"
    transformers.AutoModelForCausalLM.from_config(cls(**COMMON, **extra)).save_pretrained(src)
    bnb_cfg = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                              bnb_4bit_use_double_quant=True,
                                              bnb_4bit_compute_dtype=torch.float32)
    transformers.AutoModelForCausalLM.from_pretrained(
        src, quantization_config=bnb_cfg, dtype=torch.float32, device_map="cpu").save_pretrained(saved)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(saved, device_map="cpu")
    q_proj = theirs.model.layers[0].self_attn.q_proj
    assert type(q_proj).__name__ == "Linear4bit", type(q_proj)
    file = load_file(saved / "model.safetensors")
    assert file["model.layers.0.self_attn.q_proj.weight"].dtype == torch.uint8
    roundtrip_experts(theirs, "nf4", True)

    out = tmp / "run-bnb-saved"
    cfg = config(tmp, "bnb-saved", saved, out, "nf4", True)
    c = json.loads(cfg.read_text())
    c["training"]["train_iters"] = 1
    cfg.write_text(json.dumps(c))
    run("--config", cfg, "-q")
    merged = tmp / "merged-bnb-saved"
    run("export-hf", checkpoint(out, 0), "--merge", "--out", merged)
    m = load_file(merged / "model.safetensors")
    kept, dequantized = 0, {}
    for name in [k for k in file if k.endswith("proj.weight") and file[k].dtype == torch.uint8]:
        q = file[name]
        absmax = (bnbf.dequantize_blockwise(
            file[name + ".absmax"], absmax=file[name + ".nested_absmax"],
            code=file[name + ".nested_quant_map"], blocksize=256)
            + json.loads(bytes(file[name + ".quant_state.bitsandbytes__nf4"].tolist()))["nested_offset"])
        want = DEQUANTIZE_4BIT(q.reshape(-1), absmax.float(), file[name + ".quant_map"], 64,
                               list(m[name].shape), torch.float32)
        assert torch.equal(m[name].float(), want), f"{name}: not the saved codes' values"
        dequantized[name] = want
        kept += 1
    print(f"  {kept} saved 4-bit matrices kept as saved (merged export bitwise their dequantization)")
    assert kept == 4 * COMMON["num_hidden_layers"]

    # Damaged 4-bit states: exit 2 naming the file and the tensor, before anything is allocated
    # from their numbers.
    import shutil
    from safetensors.torch import save_file
    name = "model.layers.1.self_attn.k_proj.weight"
    state_key = name + ".quant_state.bitsandbytes__nf4"
    state = json.loads(bytes(file[state_key].tolist()))

    def packed(d):
        return torch.tensor(list(json.dumps(d).encode()), dtype=torch.uint8)

    cases = {
        "not JSON": {state_key: torch.tensor(list(b"{shape: oops"), dtype=torch.uint8)},
        "negative shape": {state_key: packed({**state, "shape": [-2, 64]})},
        "huge shape": {state_key: packed({**state, "shape": [2**40, 2**40]})},
        "odd blocksize": {state_key: packed({**state, "blocksize": 63})},
        "codes short": {name: file[name][:-1]},
        "another code book": {name + ".quant_map": file[name + ".quant_map"].flip(0).contiguous()},
        "no absmax": {name + ".absmax": None},
    }
    for what, change in cases.items():
        bad = tmp / ("hf-bnb-bad-" + what.replace(" ", "-"))
        shutil.copytree(saved, bad)
        tensors = dict(file)
        for k, v in change.items():
            if v is None:
                tensors.pop(k)
            else:
                tensors[k] = v
        save_file(tensors, bad / "model.safetensors", metadata={"format": "pt"})
        c = json.loads(cfg.read_text())
        c["model"]["init_from"] = str(bad)
        c["training"]["output_dir"] = str(tmp / ("run-bad-" + what.replace(" ", "-")))
        bad_cfg = tmp / "cfg-bad.json"
        bad_cfg.write_text(json.dumps(c))
        r = run("--config", bad_cfg, ok=False)
        last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
        assert r.returncode == 2 and str(bad) in last and "k_proj" in last, (what, r.returncode, last)
        print(f"  {what}: exit 2: {last[last.find('tensor'):][:110]}")
    dump = tmp / "logits-bnb-saved.safetensors"
    res = json.loads(run("eval", "--config", cfg, "--checkpoint", checkpoint(out, 0),
                         "--dump-logits", dump).stdout)
    d = load_file(dump)
    tokens = d["tokens"]
    # transformers' own model: bitsandbytes' CPU Linear4bit is not exact fp32 arithmetic (1.9e-3
    # from x W^T on these weights), so its loss is the check; an fp32 peer over the saved codes'
    # dequantization is held to 1e-5 on the logits.
    with torch.no_grad():
        logits = theirs.eval()(input_ids=tokens[:, :-1]).logits.float()
        peer = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
        peer_params = dict(peer.named_parameters())
        for name, value in dequantized.items():
            peer_params[name].copy_(value)
        for name, p in theirs.named_parameters():
            if "experts" in name:
                peer_params[name].copy_(p)
        exact = peer.eval()(input_ids=tokens[:, :-1]).logits
    diff = (exact - d["logits"]).abs().max().item()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             tokens[:, 1:].reshape(-1)).item()
    rel = abs(loss - res["loss"]) / loss
    print(f"  loss {res['loss']:.6f} vs transformers' Linear4bit model {loss:.6f} (rel {rel:.1e}); "
          f"logits vs transformers over the saved codes' dequantization: max |diff| {diff:.1e}")
    assert diff <= LOGITS_TOL and rel <= LOSS_RTOL, (diff, rel)



def attention_lora_over_linear4bit(tmp):
    """Attention-only LoRA against PEFT over bitsandbytes' own Linear4bit (CPU, training mode:
    dequantize + fp32 GEMM): transformers loads the model with BitsAndBytesConfig (q/k/v/o
    4-bit; it leaves the 3-D experts in fp32, which we quantize: the peer's experts are replaced
    by bitsandbytes' dequantization of their quantization), float32 throughout."""
    print("mixtral, attention-only LoRA vs PEFT over bitsandbytes' Linear4bit (nf4, double quant):")
    cls, extra = FAMILIES["mixtral"]
    torch.manual_seed(13)
    src = tmp / "hf-linear4bit"
    transformers.AutoModelForCausalLM.from_config(cls(**COMMON, **extra)).save_pretrained(src)
    out = tmp / "run-attention-4bit"
    cfg = config(tmp, "attention-4bit", src, out, "nf4", True)
    c = json.loads(cfg.read_text())
    c["lora"]["target_modules"] = ["q_proj", "k_proj", "v_proj", "o_proj"]
    cfg.write_text(json.dumps(c))
    run("--config", cfg, "-q")
    ours = [json.loads(l) for l in open(out / "metrics.jsonl")]
    ours = [m for m in ours if m["type"] == "train"]
    adapter0 = tmp / "adapter0-attention-4bit"
    run("export-hf", checkpoint(out, 0), "--adapter", "--out", adapter0)
    bnb_cfg = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                              bnb_4bit_use_double_quant=True,
                                              bnb_4bit_compute_dtype=torch.float32)
    base = transformers.AutoModelForCausalLM.from_pretrained(
        src, quantization_config=bnb_cfg, dtype=torch.float32, device_map="cpu",
        experts_implementation="eager")
    assert type(base.model.layers[0].self_attn.q_proj).__name__ == "Linear4bit"
    roundtrip_experts(base, "nf4", True)
    theirs = peft_training(tmp, None, adapter0, ours, base=base)
    adapter = tmp / "adapter-attention-4bit"
    run("export-hf", checkpoint(out, STEPS), "--adapter", "--out", adapter)
    mine = load_file(adapter / "adapter_model.safetensors")
    assert mine.keys() == theirs.keys(), f"adapter names: {sorted(mine)[:4]} vs {sorted(theirs)[:4]}"
    worst = max((mine[k] - theirs[k].detach()).abs().max().item() for k in mine)
    print(f"  final adapter: {len(mine)} tensors, max |diff| vs PEFT over Linear4bit {worst:.1e}")
    assert worst <= TENSOR_TOL, worst


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    run("make-synthetic", "--out", tmp / "data", "--vocab", "320", "--programs", "4", "--doc-len",
        str(SEQ + 1), "--train-docs", "400", "--valid-docs", "32")
    for family in [f for f in ONLY if f != "bnb"] if ONLY else ["qwen3_moe", "mixtral"]:
        for quant_type, dq in VARIANTS:
            family_test(tmp, family, quant_type, dq)
    if not ONLY or "qwen3_moe" in ONLY:
        resume_and_other_quantization(tmp)
    if not ONLY or "bnb" in ONLY:
        bnb_saved_checkpoint(tmp)
        attention_lora_over_linear4bit(tmp)
    print("ok")
