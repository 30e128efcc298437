#!/usr/bin/env python3
"""Our bitsandbytes 4-bit quantization (src/quant/bnb_4bit.cpp) against bitsandbytes itself
(the oracle, test-only, its CPU backend): for nf4 and fp4, double quant on and off, the packed
codes, the absmax (8-bit codes, nested absmax and offset under double quant) and the dequantized
values (fp32 and bf16) must be bitwise equal, for
  - matrices [out, in] of several shapes (a partial last block, an odd element count, bf16
    input, an all-zero block, outliers, a large matrix with many nested blocks);
  - expert stacks in our layout [E, in, out]: each expert's gate / up / down matrix as
    bitsandbytes quantizes the per-expert nn.Linear weight [out, in] (its transpose).

usage: bnb_4bit_test.py BNB_4BIT_REPLAY
"""
import subprocess
import sys
import tempfile
import warnings

import torch
from safetensors.torch import load_file, save_file

warnings.filterwarnings("ignore")
import bitsandbytes.functional as bnbf  # noqa: E402
import bitsandbytes.backends.utils as bnb_utils  # noqa: E402
from bitsandbytes.backends.default import ops as bnb_default  # noqa: E402

# The dequantization oracle is bitsandbytes' portable implementation (its default backend, and
# what its CPU scalar fallback computes), called uncompiled. Its C++ CPU kernels differ from it:
# the scalar one reads FP4 code 8 as -0.0 (+0.0 here and in get_4bit_type, whose list writes it
# as the integer -0), and the AVX-512 one, for rows whose length is not a multiple of the block
# size, indexes absmax per row (in / 64 rounded down) instead of per flat block, so rows of 96
# values dequantize with the wrong scales (a bitsandbytes bug; a [64, 96] matrix shows it).
DEQUANTIZE_4BIT = getattr(bnb_default._dequantize_4bit_compute, "__wrapped__",
                          bnb_default._dequantize_4bit_compute)

REPLAY = sys.argv[1]
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def inputs():
    g = torch.Generator().manual_seed(49)
    t = {}
    t["w.128x256"] = torch.randn(128, 256, generator=g) * 0.02
    t["w.33x70.partial_block"] = torch.randn(33, 70, generator=g)
    t["w.31x33.odd"] = torch.randn(31, 33, generator=g) * 3
    t["w.64x96.bf16"] = (torch.randn(64, 96, generator=g) * 0.05).to(torch.bfloat16)
    z = torch.randn(16, 128, generator=g)
    z[3] = 0  # whole blocks of zeros: absmax 0
    t["w.16x128.zero_block"] = z
    o = torch.randn(48, 64, generator=g) * 0.01
    o[5, 7], o[20, 3] = 40.0, -75.0  # outliers dominate their blocks
    t["w.48x64.outliers"] = o
    t["w.768x2048.large"] = torch.randn(768, 2048, generator=g) * 0.02
    # Expert stacks [E, in, out]: gate/up [E, d, f], down [E, f, d].
    t["experts.gate"] = torch.randn(4, 64, 96, generator=g) * 0.02
    t["experts.down"] = torch.randn(4, 96, 64, generator=g) * 0.02
    t["experts.gate_bf16"] = (torch.randn(3, 64, 32, generator=g) * 0.02).to(torch.bfloat16)
    return t


def bnb_state(w, quant_type, dq):
    """bitsandbytes' quantization of one [out, in] matrix, and its fp32 / bf16 dequantization."""
    q, st = bnbf.quantize_4bit(w, blocksize=64, compress_statistics=dq, quant_type=quant_type)
    s = {"codes": q.reshape(-1)}
    if dq:
        s["absmax"] = st.absmax.reshape(-1)
        s["nested_absmax"] = st.state2.absmax.reshape(-1)
        s["offset"] = st.offset.reshape(1).float()
        absmax = bnbf.dequantize_blockwise(st.absmax, st.state2) + st.offset
    else:
        s["absmax"] = st.absmax.reshape(-1)
        absmax = st.absmax
    code = bnb_utils._get_4bit_code(quant_type, w.device)
    for dtype, key in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        s[key] = DEQUANTIZE_4BIT(q.reshape(-1), absmax.float(), code, 64, list(w.shape), dtype)
    return s


def same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.view(torch.uint8) if a.dtype != torch.uint8 else a,
        b.view(torch.uint8) if b.dtype != torch.uint8 else b)


def compare(ours, name, ref, what):
    for key, want in ref.items():
        got = ours.get(f"{name}.{key}")
        if got is None:
            check(False, f"{what}: {key} missing from our output")
            continue
        want = want.reshape(got.shape) if want.numel() == got.numel() else want
        ok = same(got, want)
        detail = ""
        if not ok and got.shape == want.shape and got.is_floating_point():
            diff = (got.float() - want.float()).abs()
            detail = f" (max |diff| {diff.max().item():.3g}, {int((diff > 0).sum())} differ)"
        elif not ok and got.shape == want.shape:
            detail = f" ({int((got != want).sum())} of {got.numel()} differ)"
        elif not ok:
            detail = f" (shape {tuple(got.shape)} vs {tuple(want.shape)})"
        check(ok, f"{what}: {key} bitwise equal{detail}")


def main():
    src = inputs()
    with tempfile.TemporaryDirectory() as tmp:
        save_file({k: v.contiguous() for k, v in src.items()}, f"{tmp}/in.safetensors")
        for quant_type in ("nf4", "fp4"):
            for dq in (False, True):
                out = f"{tmp}/out-{quant_type}-{int(dq)}.safetensors"
                r = subprocess.run([REPLAY, f"{tmp}/in.safetensors", out, quant_type,
                                    "1" if dq else "0"], capture_output=True, text=True)
                check(r.returncode == 0, f"replay {quant_type} dq={dq} ran ({r.stderr.strip()})")
                if r.returncode != 0:
                    continue
                ours = load_file(out)
                tag = f"{quant_type} double_quant={dq}"
                for name, w in src.items():
                    if name.startswith("experts."):
                        stack = []
                        for e in range(w.shape[0]):
                            m = w[e].t().contiguous()  # the per-expert nn.Linear weight
                            ref = bnb_state(m, quant_type, dq)
                            compare(ours, f"{name}.{e}", ref, f"{tag} {name}[{e}]")
                            stack.append(ref["fp32"].t())
                        check(same(ours[f"{name}.stack.fp32"].contiguous(),
                                   torch.stack(stack).contiguous()),
                              f"{tag} {name}: the dequantized stack in our [E, in, out] layout")
                    else:
                        compare(ours, name, bnb_state(w, quant_type, dq), f"{tag} {name}")
    # The oracle itself must see a difference: one flipped code is caught.
    w = src["w.128x256"]
    q, _ = bnbf.quantize_4bit(w, blocksize=64, quant_type="nf4")
    flipped = q.reshape(-1).clone()
    flipped[17] ^= 0x10
    check(not same(flipped, q.reshape(-1)), "a flipped code is seen as a difference")
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
