#!/usr/bin/env python3
"""The benchmark peers' MoE blocks compute the same layer: bench/peer/peer.py's HF-style loop,
its grouped-GEMM block and torchtitan's own MoE layer, given the same weights and tokens, give
the same routing, router losses and outputs (loop vs grouped in fp32 to rounding; torchtitan's
experts compute in bf16, so to bf16's rounding), for softmax and sigmoid routers. A peer that
computed a different layer would make bench/run's ratios meaningless. Exit 77 (skip) when
torchtitan is not importable: the loop/grouped part still runs first."""
import dataclasses
import importlib.util
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("peer", ROOT / "bench/peer/peer.py")
peer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peer)


def config(score_function, top_k):
    fields = {f.name: None for f in dataclasses.fields(peer.Config)}
    fields.update(hidden_size=48, num_experts=8, top_k=top_k, expert_hidden_size=80,
                  score_function=score_function, normalize_topk=True, expert_dropout=0.0)
    return peer.Config(**fields)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def copy_weights(loop, grouped, titan):
    """The loop block's weights into the others' layouts (nn.Linear stores [out, in])."""
    with torch.no_grad():
        gate = torch.stack([e.w_gate.weight.t() for e in loop.experts])  # [E, d, f]
        up = torch.stack([e.w_up.weight.t() for e in loop.experts])
        down = torch.stack([e.w_down.weight.t() for e in loop.experts])  # [E, f, d]
        grouped.router.weight.copy_(loop.router.weight)
        grouped.w_gate.copy_(gate), grouped.w_up.copy_(up), grouped.w_down.copy_(down)
        if titan is not None:
            inner = titan.moe.routed_experts.inner_experts
            titan.moe.router.gate.weight.copy_(loop.router.weight)
            inner.w1_EFD.copy_(gate.transpose(1, 2))  # [E, f, d]
            inner.w3_EFD.copy_(up.transpose(1, 2))
            inner.w2_EDF.copy_(down.transpose(1, 2))  # [E, d, f]


def main():
    failures = []
    try:  # the real import: an installed torchtitan with a dependency missing is a skip too
        import torchtitan.models.common.moe  # noqa: F401
        titan_ok = True
    except Exception:
        titan_ok = False
    for score_function, top_k in (("softmax", 2), ("sigmoid", 2), ("softmax", 4)):
        torch.manual_seed(7)
        cfg = config(score_function, top_k)
        loop, grouped = peer.SparseMoeBlock(cfg), peer.GroupedMoeBlock(cfg)
        titan = peer.TitanMoeBlock(cfg) if titan_ok else None
        for p in loop.parameters():
            torch.nn.init.normal_(p, 0.0, 0.2)
        copy_weights(loop, grouped, titan)
        x = torch.randn(67, cfg.hidden_size)
        want, aux, z = loop(x)
        sides = {"grouped": (grouped(x), 1e-5)}
        if titan is not None:
            sides["torchtitan"] = (titan(x), 2e-2)
        for name, ((out, a, zz), bar) in sides.items():
            case = f"{score_function} top-{top_k} {name}"
            checks = {"output": rel(out, want), "aux loss": rel(a, aux), "z loss": rel(zz, z)}
            for what, err in checks.items():
                # The router is fp32 on every side: its losses agree to fp32 rounding.
                limit = bar if what == "output" else 1e-6
                ok = err <= limit
                print(f"{'ok  ' if ok else 'FAIL'} {case}: {what} relative difference {err:.2e} "
                      f"(bar {limit:g})")
                if not ok:
                    failures.append(f"{case} {what}")
    if failures:
        print(f"{len(failures)} checks failed: {', '.join(failures)}")
        return 1
    if not titan_ok:
        print("torchtitan is not importable: its block was not checked (skip)")
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main())
