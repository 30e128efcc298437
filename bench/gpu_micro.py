#!/usr/bin/env python3
"""Micro-benchmarks that bound one training step of the 1 B config on a GPU.

scripts/gpu-check runs this on the idle GPU while it builds (the build uses the CPUs). Each
section times what the step is made of, at the bench-gpu-1b shapes:

  copy      device-to-device copy bandwidth (the memory-bound kernels' ceiling)
  matmul    bf16 8192^3 (the measured matmul ceiling; MFU is quoted against the spec peak)
  sdpa      causal attention forward + backward per SDPA backend (flash, efficient, cudnn, math)
  grouped   torch._grouped_mm over the experts, balanced and skewed routing, vs one dense mm
            of the same FLOPs
  gate_up   the experts' gate and up projections + SwiGLU forward + backward from fp32 weights
            (as the trainer holds them): two grouped GEMMs vs the weights' bf16 copies
            concatenated and one grouped GEMM of twice the width (moe.fused_gate_up), time and
            the agreement of the output and the input gradient
  head_ce   LM head + cross-entropy forward + backward: full fp32 logits vs chunked (no [N, V]
            logits): time and peak memory, and the loss/gradient agreement of the two
  adamw     gradient clipping + fused AdamW over 1.14 B parameters: clipping as a separate
            multiply vs folded into _fused_adamw_'s grad_scale (what the trainer does), and
            their agreement
  router    one MoE layer's router gate forward + backward on bf16 hidden states (what the
            MoE layer's input would be if it were cast before the dispatch; today it is fp32):
            widened to fp32 (Megatron's moe_router_dtype fp32) vs a bf16 product (HF's gate):
            time, the memory the forward keeps for the backward, the logits' agreement and how
            many top-k choices differ

Times are medians of CUDA-event-timed repetitions (perf_counter on the CPU). --smoke runs every
section at toy sizes on the CPU (the ctest entry Bench.GpuMicroSmoke) and exits 1 when an
agreement check fails. Output: a JSON file (--out) and a table on stdout.
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F


class Clock:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def median_ms(self, fn, reps, warmup=2):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            if self.cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


def peak_reset(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_mib(device):
    return torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None


def bench_copy(clock, device, size, reps):
    x = torch.empty(size // 2, dtype=torch.bfloat16, device=device).normal_()
    y = torch.empty_like(x)
    ms = clock.median_ms(lambda: y.copy_(x), reps)
    return {"bytes": 2 * size, "ms": ms, "GB_per_s": 2 * size / ms / 1e6}


def bench_matmul(clock, device, n, reps):
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    ms = clock.median_ms(lambda: a @ b, reps)
    return {"n": n, "ms": ms, "TFLOP_per_s": 2 * n**3 / ms / 1e9}


def bench_sdpa(clock, device, batch, heads, seq, head_dim, dtype, reps):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype,
                           requires_grad=True) for _ in range(3))
    grad = torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype)
    # Causal attention FLOPs, halved for the mask: forward 2 matmuls, backward 5.
    flops = 7 * 2 * batch * heads * seq * seq * head_dim / 2
    rows = {}
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            rows[name.lower()] = {"error": "not in this torch"}
            continue

        def step():
            with sdpa_kernel([backend]):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(grad)
            q.grad = k.grad = v.grad = None

        try:
            ms = clock.median_ms(step, reps)
            rows[name.lower()] = {"ms": ms, "TFLOP_per_s_causal": flops / ms / 1e9}
        except RuntimeError as e:  # a backend that does not take this shape/dtype/device
            rows[name.lower()] = {"error": str(e).splitlines()[0][:160]}
    return {"shape": [batch, heads, seq, head_dim], "dtype": str(dtype), "backends": rows}


def grouped_offsets(counts, device):
    return torch.tensor(counts, device=device, dtype=torch.int32).cumsum(0).to(torch.int32)


def bench_grouped(clock, device, experts, tokens, top_k, d, f, dtype, reps):
    rows = tokens * top_k
    x = torch.randn(rows, d, device=device, dtype=dtype)
    w = torch.randn(experts, d, f, device=device, dtype=dtype)
    dense_w = torch.randn(d, f, device=device, dtype=dtype)
    balanced = [rows // experts] * experts
    balanced[-1] += rows - sum(balanced)
    skewed = [rows // 2] + [(rows - rows // 2) // (experts - 1)] * (experts - 1)
    skewed[-1] += rows - sum(skewed)
    flops = 2 * rows * d * f
    out = {"shape": {"experts": experts, "rows": rows, "d": d, "f": f}}
    out["dense"] = {"ms": clock.median_ms(lambda: x @ dense_w, reps)}
    for name, counts in (("balanced", balanced), ("skewed", skewed)):
        offs = grouped_offsets(counts, device)
        try:
            ms = clock.median_ms(lambda: torch._grouped_mm(x, w, offs=offs), reps)
            out[name] = {"ms": ms}
        except (RuntimeError, AttributeError) as e:
            out[name] = {"error": str(e).splitlines()[0][:160]}
    for row in out.values():
        if "ms" in row:
            row["TFLOP_per_s"] = flops / row["ms"] / 1e9
    return out


def bench_gate_up(clock, device, experts, tokens, top_k, d, f, dtype, reps):
    torch.manual_seed(4)
    rows = tokens * top_k
    x0 = torch.randn(rows, d, device=device).to(dtype)
    w_gate = (torch.randn(experts, d, f, device=device) * 0.02).requires_grad_()
    w_up = (torch.randn(experts, d, f, device=device) * 0.02).requires_grad_()
    dh = torch.randn(rows, f, device=device).to(dtype)
    counts = [rows // experts] * experts
    counts[-1] += rows - sum(counts)
    offs = grouped_offsets(counts, device)

    def step(fused):
        x = x0.clone().requires_grad_()
        if fused:
            w = torch.cat([w_gate.to(dtype), w_up.to(dtype)], 2)
            gate, up = torch._grouped_mm(x, w, offs=offs).chunk(2, -1)
        else:
            gate = torch._grouped_mm(x, w_gate.to(dtype), offs=offs)
            up = torch._grouped_mm(x, w_up.to(dtype), offs=offs)
        h = F.silu(gate) * up
        h.backward(dh)
        w_gate.grad = w_up.grad = None
        return h.detach(), x.grad

    out = {"shape": {"experts": experts, "rows": rows, "d": d, "f": f}, "dtype": str(dtype)}
    try:
        results = {}
        for name, fused in (("two_gemms", False), ("one_gemm", True)):
            results[name] = step(fused)
            out[name] = {"ms": clock.median_ms(lambda: step(fused), reps)}
    except (RuntimeError, AttributeError, NotImplementedError) as e:
        out["error"] = str(e).splitlines()[0][:160]
        return out
    (h2, g2), (h1, g1) = results["two_gemms"], results["one_gemm"]
    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()
    out["agreement"] = {"h_rel": rel(h1, h2), "grad_x_rel": rel(g1, g2)}
    return out


class ChunkedHeadCE(torch.autograd.Function):
    """Mean cross-entropy of (h @ W^T) without the [N, V] logits: each chunk's logits live only
    inside forward, which computes the gradients of h and W at once (fp32 softmax)."""

    @staticmethod
    def forward(ctx, h, weight, labels, chunk):
        n = h.shape[0]
        loss = torch.zeros((), device=h.device, dtype=torch.float32)
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros(weight.shape, device=weight.device, dtype=torch.float32)
        for s in range(0, n, chunk):
            hc, yc = h[s:s + chunk], labels[s:s + chunk]
            logits = (hc @ weight.t()).float()
            lse = torch.logsumexp(logits, dim=1)
            loss += (lse - logits.gather(1, yc.unsqueeze(1)).squeeze(1)).sum()
            g = torch.softmax(logits, dim=1)
            g[torch.arange(yc.numel(), device=h.device), yc] -= 1.0
            g /= n
            grad_h[s:s + chunk] = (g.to(h.dtype) @ weight).to(h.dtype)
            grad_w += g.t() @ hc.float()
        ctx.save_for_backward(grad_h, grad_w.to(weight.dtype))
        return loss / n

    @staticmethod
    def backward(ctx, grad_loss):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_loss, grad_w * grad_loss, None, None


def bench_head_ce(clock, device, tokens, d, vocab, chunk, dtype, reps):
    torch.manual_seed(0)
    h0 = (torch.randn(tokens, d, device=device) * 0.5).to(dtype)
    w0 = (torch.randn(vocab, d, device=device) * 0.02).to(dtype)
    labels = torch.randint(0, vocab, (tokens,), device=device)

    def full():
        h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
        loss = F.cross_entropy((h @ w.t()).float(), labels)
        loss.backward()
        return loss.detach(), h.grad, w.grad

    def chunked():
        h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
        loss = ChunkedHeadCE.apply(h, w, labels, chunk)
        loss.backward()
        return loss.detach(), h.grad, w.grad

    out = {"shape": {"tokens": tokens, "d": d, "vocab": vocab, "chunk": chunk},
           "dtype": str(dtype)}
    results = {}
    for name, fn in (("full", full), ("chunked", chunked)):
        peak_reset(device)
        results[name] = fn()
        row = {"peak_MiB": peak_mib(device)}
        row["ms"] = clock.median_ms(fn, reps)
        out[name] = row
    (lf, hf, wf), (lc, hc, wc) = results["full"], results["chunked"]

    def rel(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()

    out["agreement"] = {"loss_rel": abs(lc.item() - lf.item()) / abs(lf.item()),
                        "grad_h_rel": rel(hc, hf), "grad_w_rel": rel(wc, wf)}
    return out


def bench_adamw(clock, device, params, max_norm, reps):
    # Parameters as tensors of at most 64 M values (a model's largest are the embedding/head).
    sizes, left = [], params
    while left > 0:
        sizes.append(min(left, 64 * 2**20))
        left -= sizes[-1]
    g = torch.Generator(device=device).manual_seed(1)
    weights = [torch.randn(s, device=device, generator=g) for s in sizes]
    grads = [torch.randn(s, device=device, generator=g) * 1e-3 for s in sizes]
    state = {}

    def fresh():
        state["w"] = [w.clone() for w in weights]
        state["g"] = [x.clone() for x in grads]
        state["m"] = [torch.zeros_like(w) for w in weights]
        state["v"] = [torch.zeros_like(w) for w in weights]
        state["steps"] = [torch.zeros((), device=device) for _ in weights]

    def adam(grad_scale):
        torch._foreach_add_(state["steps"], 1)  # counted before the update, as torch.optim does
        torch._fused_adamw_(state["w"], state["g"], state["m"], state["v"], [], state["steps"],
                            lr=3e-4, beta1=0.9, beta2=0.95, weight_decay=0.1, eps=1e-8,
                            amsgrad=False, maximize=False, grad_scale=grad_scale, found_inf=None)

    def norm():
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(state["g"], 2)), 2)

    def separate():  # clip_grad_norm_'s way: scale the grads, then the update
        total = norm()
        coef = (max_norm / (total + 1e-6)).clamp_max(1.0)
        torch._foreach_mul_(state["g"], coef)
        adam(None)

    def folded():  # the trainer's: the grads untouched; the update divides by 1 / coef
        total = norm()
        coef = (max_norm / (total + 1e-6)).clamp_max(1.0)
        adam((1.0 / coef).to(torch.float32))

    out = {"params": params, "max_norm": max_norm}
    fresh()
    out["grad_norm"] = norm().item()
    for name, fn in (("separate", separate), ("folded", folded)):
        fresh()
        out[name] = {"ms": clock.median_ms(fn, reps, warmup=1)}
    fresh()
    separate()
    w_sep, m_sep = [w.clone() for w in state["w"]], [m.clone() for m in state["m"]]
    fresh()
    folded()
    # Adam's step hardly depends on a constant gradient scale, so the first moment (which holds
    # the clipped gradient) is compared too: it is what a wrong grad_scale would change.
    worst = max(((a - b).abs().max() / (a - b0).abs().max().clamp_min(1e-30)).item()
                for a, b, b0 in zip(w_sep, state["w"], weights))
    worst_m = max(((a - b).abs().max() / a.abs().max().clamp_min(1e-30)).item()
                  for a, b in zip(m_sep, state["m"]))
    out["agreement"] = {"update_rel_max": worst, "exp_avg_rel_max": worst_m}
    # Bytes the update must move: w, g, m, v read; w, m, v written (fp32); clipping as a separate
    # pass adds a read and a write of g.
    out["bytes_update"] = params * 4 * 7
    out["bytes_clip_pass"] = params * 4 * 2
    return out


def bench_router(clock, device, tokens, d, experts, top_k, dtype, reps):
    torch.manual_seed(2)
    x0 = torch.randn(tokens, d, device=device).to(dtype)
    w = (torch.randn(experts, d, device=device) * 0.02).requires_grad_()
    probe = torch.randn(tokens, experts, device=device)

    def gate(x, kind):
        if kind == "fp32":
            return F.linear(x.float(), w)
        return F.linear(x, w.to(x.dtype)).float()

    def step(kind):
        x = x0.clone().requires_grad_()
        logits = gate(x, kind)
        (logits.softmax(-1) * probe).sum().backward()
        return logits.detach()

    out = {"shape": {"tokens": tokens, "d": d, "experts": experts}, "dtype": str(dtype)}
    logits = {}
    for kind in ("fp32", "input"):
        x = x0.clone().requires_grad_()
        peak_reset(device)
        before = torch.cuda.memory_allocated() if device.type == "cuda" else 0
        kept = gate(x, kind)  # what autograd keeps for the backward, with the logits
        held = (torch.cuda.memory_allocated() - before) / 2**20 if device.type == "cuda" else None
        del kept, x
        logits[kind] = step(kind)
        out[kind] = {"ms": clock.median_ms(lambda: step(kind), reps), "kept_for_backward_MiB": held}
    a, b = logits["input"], logits["fp32"]
    top_a, top_b = a.topk(top_k, -1).indices.sort(-1).values, b.topk(top_k, -1).indices.sort(-1).values
    out["agreement"] = {"logits_rel": ((a - b).norm() / b.norm()).item(),
                        "tokens_with_other_experts": (top_a != top_b).any(-1).float().mean().item()}
    return out


SECTIONS = ("copy", "matmul", "sdpa", "grouped", "gate_up", "head_ce", "adamw", "router")


def shapes(smoke):
    if smoke:
        return {"copy": 1 << 22, "matmul": 256, "sdpa": (1, 2, 128, 32), "grouped": (4, 64, 2, 32, 48),
                "gate_up": (4, 64, 2, 32, 24), "head_ce": (96, 32, 500, 40), "adamw": (300_000, 0.1), "router": (256, 64, 8, 2),
                "reps": 3}
    # bench-gpu-1b: micro-batch 8 x 2048 tokens, hidden 2048, 16 heads, 8 experts top-2 of width
    # 1024, vocab 32000; 1.14 B parameters. AdamW's max_norm is below the gradients' norm (~34 on
    # the GPU, ~0.55 in the smoke run), so clipping is active and the agreement check can fail.
    return {"copy": 1 << 30, "matmul": 8192, "sdpa": (8, 16, 2048, 128),
            "grouped": (8, 16384, 2, 2048, 2 * 1024), "gate_up": (8, 16384, 2, 2048, 1024),
            "head_ce": (16384, 2048, 32000, 2048),
            "adamw": (1_140_000_000, 1.0), "router": (16384, 2048, 8, 2), "reps": 10}


def run(args):
    device = torch.device("cpu" if args.smoke else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_micro: no CUDA device (use --smoke on a CPU)", file=sys.stderr)
        return 77
    clock = Clock(device)
    s = shapes(args.smoke)
    reps = s["reps"]
    half = torch.float32 if args.smoke else torch.bfloat16
    started = time.monotonic()
    report = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "sections": {}}
    wanted = args.sections.split(",") if args.sections else SECTIONS
    for name in wanted:
        if name not in SECTIONS:
            print(f"gpu_micro: unknown section {name!r}; expected one of {', '.join(SECTIONS)}",
                  file=sys.stderr)
            return 2
        if time.monotonic() - started > args.budget_s:
            report["sections"][name] = {"skipped": f"budget of {args.budget_s} s spent"}
            continue
        t0 = time.monotonic()
        try:
            if name == "copy":
                r = bench_copy(clock, device, s["copy"], reps)
            elif name == "matmul":
                r = bench_matmul(clock, device, s["matmul"], reps)
            elif name == "sdpa":
                r = bench_sdpa(clock, device, *s["sdpa"], half, reps)
            elif name == "grouped":
                r = bench_grouped(clock, device, *s["grouped"], half, reps)
            elif name == "gate_up":
                r = bench_gate_up(clock, device, *s["gate_up"], half, reps)
            elif name == "head_ce":
                r = bench_head_ce(clock, device, *s["head_ce"], half, reps)
            elif name == "adamw":
                r = bench_adamw(clock, device, *s["adamw"], max(3, reps // 2))
            else:
                r = bench_router(clock, device, *s["router"], half, reps)
        except torch.OutOfMemoryError as e:
            r = {"error": "out of memory: " + str(e).splitlines()[0][:120]}
        r["wall_s"] = round(time.monotonic() - t0, 2)
        report["sections"][name] = r
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"{name}: {json.dumps(r)}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return check(report, args.smoke)


def check(report, smoke):
    """Agreement checks (chunked vs full head + CE, folded vs separate clipping): exit 1 when one
    fails. fp32 on the CPU is held tight; bf16 on a GPU to its precision."""
    bad = []
    ce = report["sections"].get("head_ce", {}).get("agreement")
    if ce:
        bar = 1e-5 if smoke else 2e-2
        bad += [f"head_ce {k} = {v:.3g} > {bar}" for k, v in ce.items() if not v <= bar]
    ad = report["sections"].get("adamw", {}).get("agreement")
    if ad:
        bad += [f"adamw {k} = {v:.3g} > 1e-3" for k, v in ad.items() if not v <= 1e-3]
    gu = report["sections"].get("gate_up", {}).get("agreement")
    if gu:  # one GEMM vs two: the same products, x's gradient rounded once instead of twice
        bar = 1e-5 if smoke else 1e-2
        bad += [f"gate_up {k} = {v:.3g} > {bar}" for k, v in gu.items() if not v <= bar]
    ro = report["sections"].get("router", {}).get("agreement")
    if ro:  # bf16 operands: the product within bf16's rounding of the fp32 one
        bar = 1e-6 if smoke else 1e-2
        if not ro["logits_rel"] <= bar:
            bad.append(f"router logits_rel = {ro['logits_rel']:.3g} > {bar}")
    for b in bad:
        print("gpu_micro: FAILED " + b, file=sys.stderr)
    return 1 if bad else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="toy sizes on the CPU (the ctest entry)")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--sections", help="comma-separated subset of " + ",".join(SECTIONS))
    p.add_argument("--budget-s", type=float, default=math.inf,
                   help="skip the sections that would start after this many seconds")
    sys.exit(run(p.parse_args()))


if __name__ == "__main__":
    main()
