#!/usr/bin/env python3
"""Adam moments in bf16 and 8-bit (optimizer.exp_avg_dtype / exp_avg_sq_dtype), and 16-bit
working weights (training.param_dtype bf16: fp32 master in the optimizer, or
optimizer.main_params_dtype bf16 with a Kahan compensation, or the fp32 master offloaded):
1. the 8-bit update against bitsandbytes' 8-bit AdamW (the oracle, test-only) on the same
   tensors: the same dynamic maps, codes, scales and weights after 20 steps;
2. the bf16 update against the same formula written in PyTorch with bf16 moments;
3. each tier trains the demo (configs/tiny.json, 300 steps) to validation accuracy >= 0.90 and a
   final validation loss at most 2% above the fp32 run's and at most 5% below it (the fp32
   run's own seed-to-seed spread is about 2% wide, 0.02815-0.02921 over seeds 1234/1/2/3, so a
   tier ending a little lower is noise, not a defect); the offloaded fp32 master computes what
   the on-device one does, so on a CPU its 20 steps equal w16's bitwise (model file and losses)
   instead of training the demo a third time on bf16's slow CPU fallback;
4. 10 + 10 steps resumed = 20 straight, bitwise (model and optimizer files), for each tier;
5. a checkpoint of one tier resumes under another (8-bit -> fp32, fp32 -> 8-bit, each 16-bit
   weight tier -> fp32 weights: model.safetensors holds the fp32 master, and fp32 -> 16-bit).

usage: optimizer_precision_test.py MOE_TRAIN ADAMW_REPLAY SOURCE_DIR [--group moments|weights]
(moments: 1, 2 and the moment tiers of 3-5; weights: the 16-bit weight tiers of 3-5; both by
default. ctest runs the two groups as two entries.)
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

BIN, REPLAY, SRC = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


HP = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}
STEPS = 20


def inputs(n, seed):
    g = torch.Generator().manual_seed(seed)
    param = torch.randn(n, generator=g) * 0.1
    # Gradients of changing scale, and a block of zeros (absmax 0) in every step.
    grads = [torch.randn(n, generator=g) * (0.5 + k / 10) for k in range(STEPS)]
    for gr in grads:
        gr[256:512] = 0
    return param, grads


def replay(tmp, param, grads, m_dtype, v_dtype):
    src, out = tmp / "in.safetensors", tmp / "out.safetensors"
    tensors = {"param": param.contiguous()}
    tensors.update({f"grad.{k}": gr.contiguous() for k, gr in enumerate(grads)})
    save_file(tensors, str(src), metadata={k: repr(v) for k, v in HP.items()})
    r = subprocess.run([REPLAY, src, out, m_dtype, v_dtype], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return load_file(str(out))


def bnb_8bit(param, grads, nearest):
    """bitsandbytes' 8-bit AdamW on the CPU. nearest: its quantiser swapped for the one of its
    pure-PyTorch "default" backend (backends/default/ops.py: clamp(x * (1 / absmax), -1, 1), then
    the nearest code by midpoints), which ours follows; otherwise its C library's, whose
    approximate binary search (BinSearch) takes a neighbouring code for about 0.15% of values
    near a midpoint."""
    import bitsandbytes as bnb
    import bitsandbytes.backends.cpu.ops as cpu_ops

    def default_quantizer(a, code, absmax_out, out_uint8, blocksize):
        flat = a.reshape(-1).float()
        n = flat.numel()
        blocks = -(n // -blocksize)
        padded = torch.cat([flat, flat.new_zeros(blocks * blocksize - n)]).view(blocks, blocksize)
        absmax = padded.abs().max(dim=-1)[0]
        scaled = torch.clamp(padded * (1.0 / absmax.clamp(min=1e-38).view(-1, 1)), -1, 1)
        q = torch.bucketize(scaled.reshape(-1), (code[:-1] + code[1:]) / 2, out_int32=True)
        out_uint8.copy_(q[:n].to(torch.uint8).view(out_uint8.shape))
        absmax_out.copy_(absmax)

    saved = cpu_ops._quant_blockwise_fp32_direct
    if nearest:
        cpu_ops._quant_blockwise_fp32_direct = default_quantizer
    try:
        p = torch.nn.Parameter(param.clone())
        opt = bnb.optim.AdamW8bit([p], lr=HP["lr"], betas=(HP["beta1"], HP["beta2"]),
                                  eps=HP["eps"], weight_decay=HP["weight_decay"], min_8bit_size=4096)
        for gr in grads:
            p.grad = gr.clone()
            opt.step()
    finally:
        cpu_ops._quant_blockwise_fp32_direct = saved
    return p.detach(), opt.state[p], bnb.__version__


def compare_8bit(ours, theirs):
    p, st = theirs
    same1 = (st["state1"] == ours["exp_avg.raw"]).float().mean().item()
    same2 = (st["state2"] == ours["exp_avg_sq.raw"]).float().mean().item()
    a1 = ((st["absmax1"] - ours["exp_avg.absmax"]).abs().max() / st["absmax1"].abs().max()).item()
    a2 = ((st["absmax2"] - ours["exp_avg_sq.absmax"]).abs().max() / st["absmax2"].abs().max()).item()
    dp = (p - ours["param"]).abs().max().item()
    return same1, same2, a1, a2, dp


def oracle_8bit(tmp):
    n = 3 * 4096 + 77  # a partial last block
    param, grads = inputs(n, 1)
    ours = replay(tmp, param, grads, "8bit", "8bit")
    p, st, version = bnb_8bit(param, grads, nearest=True)
    check(torch.equal(st["qmap1"], ours["map.signed"]) and
          torch.equal(st["qmap2"], ours["map.unsigned"]),
          "the signed and unsigned dynamic maps equal bitsandbytes' create_dynamic_map")
    same1, same2, a1, a2, dp = compare_8bit(ours, (p, st))
    print(f"     8-bit vs bitsandbytes {version} AdamW8bit with its default-backend quantiser, {n} "
          f"values, {STEPS} steps: codes equal {same1:.6f} / {same2:.6f}, absmax rel "
          f"{a1:.1e} / {a2:.1e}, weights max abs {dp:.1e}")
    check(same1 == 1.0 and same2 == 1.0, "codes equal bitsandbytes' after 20 steps")
    check(a1 == 0 and a2 == 0, "block scales equal bitsandbytes'")
    check(dp <= 1e-7, f"weights within 1e-7 of bitsandbytes' ({dp:.1e})")

    # Against its C library's quantiser: a code flips near midpoints and the runs drift apart by
    # a fraction of one step's size (docs/memory.md, "8-bit moments").
    p, st, _ = bnb_8bit(param, grads, nearest=False)
    same1, same2, a1, a2, dp = compare_8bit(ours, (p, st))
    print(f"     ... with its C library's quantiser: codes equal {same1:.4f} / {same2:.4f}, "
          f"weights max abs {dp:.1e} (lr {HP['lr']})")
    check(same1 >= 0.95 and same2 >= 0.95 and dp <= HP["lr"],
          "against bitsandbytes' C quantiser: >= 95% of codes equal, weights within one lr")

    small = replay(tmp, param[:1000].clone(), [gr[:1000].clone() for gr in grads], "8bit", "8bit")
    check(small["exp_avg.raw"].dtype == torch.float32 and "exp_avg.absmax" not in small,
          "a parameter under 4096 values keeps fp32 moments (bitsandbytes' min_8bit_size)")


def formula_bf16(tmp):
    param, grads = inputs(5000, 2)
    ours = replay(tmp, param, grads, "bf16", "bf16")
    p = param.clone()
    m = torch.zeros_like(p, dtype=torch.bfloat16)
    v = torch.zeros_like(p, dtype=torch.bfloat16)
    b1, b2 = HP["beta1"], HP["beta2"]
    for t, g in enumerate(grads, start=1):
        mf, vf = m.float(), v.float()
        mf.mul_(b1).add_(g, alpha=1 - b1)
        vf.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (vf.sqrt() / (1 - b2 ** t) ** 0.5).add_(HP["eps"])
        p.mul_(1 - HP["lr"] * HP["weight_decay"])
        p.addcdiv_(mf, denom, value=-HP["lr"] / (1 - b1 ** t))
        m, v = mf.to(torch.bfloat16), vf.to(torch.bfloat16)
    check(ours["exp_avg.raw"].dtype == torch.bfloat16, "bf16 moments are stored as bf16")
    check(torch.equal(ours["param"], p) and torch.equal(ours["exp_avg.raw"], m) and
          torch.equal(ours["exp_avg_sq.raw"], v),
          "bf16 tier: weights and moments equal the formula in PyTorch, bitwise")


def train(tmp, name, sets, threads=None):
    args = [BIN, "--config", SRC / "configs/tiny.json", "-q",
            "--set", f"data.train_path={tmp / 'data/train.h5'}",
            "--set", f"data.valid_path={tmp / 'data/valid.h5'}",
            "--set", f"training.output_dir={tmp / name}"]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads)) if threads else None
    return subprocess.run(args, capture_output=True, text=True, env=env)


def evals(run):
    lines = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    return [m for m in lines if m["type"] == "eval"]


def train_metrics(run):
    lines = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    return [m for m in lines if m["type"] == "train"]


def moments(m, v):
    return {"optimizer.exp_avg_dtype": m, "optimizer.exp_avg_sq_dtype": v}


W16 = {"bf16.enabled": "true", "training.param_dtype": "bf16"}
TIERS = {"fp32": moments("fp32", "fp32"), "bf16": moments("bf16", "bf16"),
         "8bit": moments("8bit", "8bit"), "bf16-m+8bit-v": moments("bf16", "8bit"),
         "w16": W16, "w16-kahan": dict(W16, **{"optimizer.main_params_dtype": "bf16"}),
         "w16-offload": dict(W16, **{"zero_optimization.offload_optimizer.device": "cpu"})}
# Resumed and crossed only (each of its parts trains the demo above). Offload streams gradients
# to the host during the backward and sums 16-bit ones in fp32 there: two micro-batches of 16
# (the same 32 sequences a step) exercise the sums.
COMBINED = {"w16-8bit": dict(W16, **moments("8bit", "8bit")),
            "w16-offload-2mb": dict(TIERS["w16-offload"],
                                    **{"train_micro_batch_size_per_gpu": "16",
                                       "gradient_accumulation_steps": "2"})}
BATCH_KEYS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
# A tier whose run equals another's bitwise (checked on the resume's straight runs) trains the
# demo through it: the offloaded master is the on-device one's arithmetic on the host.
SAME_AS = {"w16-offload": "w16"}
RESUME_AT, RESUMED_STEPS = 10, 20
GROUP = sys.argv[sys.argv.index("--group") + 1] if "--group" in sys.argv else "all"


def in_group(*tiers):
    """Whether a check over these tiers belongs to this run's group (fp32 is in both)."""
    weights = any(t.startswith("w16") for t in tiers)
    return GROUP == "all" or (GROUP == "weights") == weights


def tiers_train(tmp):
    results = {}
    for tier, sets in TIERS.items():
        if (tier != "fp32" and not in_group(tier)) or tier in SAME_AS:
            continue
        r = train(tmp, f"demo-{tier}", dict(sets, **{"training.train_iters": 300,
                                                     "training.eval_interval": 0}))
        check(r.returncode == 0, f"{tier}: trains (exit {r.returncode}) {r.stderr[-300:]}")
        if r.returncode == 0:
            e = evals(tmp / f"demo-{tier}")[-1]
            results[tier] = e
    base = results.get("fp32")
    for tier, e in results.items():
        rel = (e["loss"] - base["loss"]) / base["loss"] if base else float("nan")
        print(f"     {tier:>14}: step {e['step']} validation loss {e['loss']:.4f} "
              f"({rel:+.2%} vs fp32), accuracy {e['accuracy']:.4f}")
        check(e["accuracy"] >= 0.90, f"{tier}: validation accuracy {e['accuracy']:.4f} >= 0.90")
        check(rel <= 0.02, f"{tier}: final validation loss at most 2% above fp32's ({rel:+.2%})")
        # ... and not far below it either: a tier far off in either direction is suspect.
        check(rel >= -0.05, f"{tier}: final validation loss at most 5% below fp32's ({rel:+.2%})")


def tiers_resume(tmp):
    for tier, tier_sets in dict(TIERS, **COMBINED).items():
        if tier == "fp32" or not in_group(tier):
            continue  # tests/checkpoint/checkpoint_test.py holds the fp32 resume
        sets = dict(tier_sets, **{"training.train_iters": RESUMED_STEPS, "training.eval_interval": 0,
                                  "checkpoint.save_interval": RESUME_AT})
        # One intra-op thread: LibTorch's multithreaded CPU kernels are not run-to-run bitwise in
        # a bf16 run under load (docs/memory.md, "Resumes and threads"); this compares our resume.
        straight = train(tmp, f"straight-{tier}", sets, threads=1)
        first = train(tmp, f"resumed-{tier}", dict(sets, **{"training.exit_interval": RESUME_AT}),
                      threads=1)
        second = train(tmp, f"resumed-{tier}", sets, threads=1)
        codes = (straight.returncode, first.returncode, second.returncode)
        last = f"checkpoints/step-{RESUMED_STEPS:08d}"
        differ = [f for f in ("model.safetensors", "optimizer.safetensors")
                  if all(c == 0 for c in codes) and
                  (tmp / f"straight-{tier}/{last}/{f}").read_bytes() !=
                  (tmp / f"resumed-{tier}/{last}/{f}").read_bytes()]
        same = all(c == 0 for c in codes) and not differ
        check(same, f"{tier}: {RESUME_AT} + {RESUME_AT} resumed = {RESUMED_STEPS} straight, model "
                    f"and optimizer bitwise (exits {codes}"
                    f"{', differ: ' + ', '.join(differ) if differ else ''})")
        if same and tier.startswith("w16"):
            model = load_file(str(tmp / f"straight-{tier}/{last}/model.safetensors"))
            check(all(t.dtype == torch.float32 for t in model.values()) and
                  any((t.to(torch.bfloat16).float() != t).any() for t in model.values()),
                  f"{tier}: model.safetensors holds the fp32 master (not bf16-rounded values)")

    for tier, twin in SAME_AS.items():
        if not in_group(tier):
            continue
        last = f"checkpoints/step-{RESUMED_STEPS:08d}/model.safetensors"
        runs = [tmp / f"straight-{t}" for t in (tier, twin)]
        equal = all((r / last).exists() for r in runs) and \
            (runs[0] / last).read_bytes() == (runs[1] / last).read_bytes() and \
            [m["loss"] for m in train_metrics(runs[0])] == [m["loss"] for m in train_metrics(runs[1])]
        check(equal, f"{tier}: {RESUMED_STEPS} steps equal {twin}'s bitwise (model file and every "
                     f"loss), so {twin}'s demo bar below holds for it")

    # A checkpoint of one tier resumes under another: through fp32, then the run's own storage.
    for src_tier, dst_tier in (("8bit", "fp32"), ("fp32", "8bit"), ("bf16", "fp32"),
                               ("bf16-m+8bit-v", "fp32"), ("w16", "fp32"),
                               ("w16-kahan", "fp32"), ("w16-offload-2mb", "fp32"),
                               ("fp32", "w16-kahan"), ("w16-8bit", "w16")):
        if not in_group(src_tier, dst_tier):
            continue
        every = dict(TIERS, **COMBINED)
        # One batch layout for both runs (the source's).
        sets = {"training.train_iters": 40, "training.eval_interval": 0,
                "checkpoint.save_interval": 20,
                **{k: v for k, v in every[src_tier].items() if k in BATCH_KEYS}}
        run = f"cross-{src_tier}-{dst_tier}"
        first = train(tmp, run, dict(sets, **every[src_tier], **{"training.exit_interval": 20}))
        second = train(tmp, run, dict(every[dst_tier], **sets))
        out = tmp / f"{run}/checkpoints/step-00000040"
        opt = load_file(str(out / "optimizer.safetensors")) if second.returncode == 0 else {}
        want = torch.uint8 if dst_tier.endswith("8bit") else torch.float32
        dtypes = {t.dtype for k, t in opt.items() if k.endswith(".exp_avg") and t.numel() >= 4096}
        comp = any(k.endswith(".compensation") for k in opt)
        check(first.returncode == 0 and second.returncode == 0 and dtypes == {want} and
              comp == (dst_tier == "w16-kahan"),
              f"a {src_tier} checkpoint resumes as {dst_tier} (exit {second.returncode}; "
              f"moments {dtypes}, compensation {comp}) {second.stderr[-300:]}")
        if second.returncode == 0:
            losses = [json.loads(l) for l in (tmp / run / "metrics.jsonl").read_text().splitlines()]
            last = [m for m in losses if m["type"] == "train"][-1]
            check(last["loss"] < 3.0, f"{src_tier} -> {dst_tier}: training continues "
                                      f"(loss {last['loss']:.3f} at step {last['step']})")


def main():
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        if GROUP != "weights":
            oracle_8bit(tmp)
            formula_bf16(tmp)
        if "--oracle-only" in sys.argv:
            return 1 if failures else 0
        r = subprocess.run([BIN, "make-synthetic", "--out", tmp / "data", "--vocab", "64",
                            "--programs", "4", "--doc-len", "65", "--train-docs", "4000",
                            "--valid-docs", "256"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        tiers_resume(tmp)
        tiers_train(tmp)
    if failures:
        print(f"{len(failures)} checks failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
