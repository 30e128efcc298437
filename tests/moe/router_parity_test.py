"""Our router against transformers' own DeepSeek-V3 router (DeepseekV3TopkRouter, the routing
GLM-4.5, Kimi-K2 and Moonlight share: sigmoid scores, choice on scores + e_score_correction_bias,
n_group groups scored by their two best, topk_group kept, top-k inside; the chosen unbiased
scores renormalised, times routed_scaling_factor). Each setting routes 10,000 random logit
vectors with a random correction bias through both (tests/moe/router_replay.cpp runs
moe::RouterImpl::forward with an identity weight, so both routers see the same logits): the
chosen experts must be the same sets, and the weights equal up to the order of the
renormalising sum (transformers adds the k scores in torch.topk's unsorted order, we in rank
order: a few ulps, bound 4 ulps of the largest weight). A second batch with logits on a coarse
grid puts ties in the keys: there our rule (the lower expert id wins, as in our CUDA kernel, on
every device) and torch.topk's (unspecified; its CPU order here) may choose differently, and
every row where they do must hold a tie at the edge of the choice: the keys chosen by either
are the same multiset, or two groups tie at the edge of the kept ones. DeepSeek-V2's router
(DeepseekV2TopkRouter: softmax scores, greedy or group_limited_greedy, never renormalised) on
V2's and V2-Lite's settings the same way.
With --device cuda (exit 77 without a GPU): both routers on the GPU, ours through its fused
kernel. There torch.topk keeps, among values equal to the k-th, the first in index order (its
CUDA gatherTopK), our rule: every row of both batches must choose the same experts.
usage: router_parity_test.py ROUTER_REPLAY [--device cuda]"""
import pathlib
import subprocess
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

REPLAY = sys.argv[1]
CUDA = sys.argv[2:] == ["--device", "cuda"]
if CUDA and not torch.cuda.is_available():
    print("skipped: no CUDA device")
    sys.exit(77)
DEVICE = "cuda" if CUDA else "cpu"
torch.backends.cuda.matmul.allow_tf32 = False  # the identity router weight must pass logits exactly
N = 10000
# (experts, top-k, n_group, topk_group, routed_scaling_factor, V2): the published configs' routing.
# V2 (DeepseekV2TopkRouter): softmax scores, no correction bias, never renormalised; groups (its
# group_limited_greedy) scored by their best expert.
SETTINGS = {
    "DeepSeek-V3": (256, 8, 8, 4, 2.5, False),
    "GLM-4.5": (160, 8, 1, 1, 2.5, False),
    "GLM-4.5-Air": (128, 8, 1, 1, 1.0, False),
    "8 experts in 4 groups, 2 kept, top-2 (the tests' tiny GLM)": (8, 2, 4, 2, 2.5, False),
    "DeepSeek-V2 (group_limited_greedy)": (160, 6, 8, 3, 16.0, True),
    "DeepSeek-V2-Lite (greedy)": (64, 6, 1, 1, 1.0, True),
}


def theirs_v2(logits, E, k, n_group, topk_group, scaling):
    config = transformers.DeepseekV2Config(hidden_size=E, n_routed_experts=E, num_experts_per_tok=k,
                                           n_group=n_group, topk_group=topk_group,
                                           routed_scaling_factor=scaling,
                                           topk_method="group_limited_greedy" if n_group > 1 else "greedy")
    router = DeepseekV2TopkRouter(config).to(DEVICE)
    with torch.no_grad():
        router.weight.copy_(torch.eye(E))
        _, w, idx = router(logits.to(DEVICE))
    return idx.cpu(), w.cpu()


def theirs(logits, bias, E, k, n_group, topk_group, scaling, normalize, v2):
    if v2:
        return theirs_v2(logits, E, k, n_group, topk_group, scaling)
    config = transformers.DeepseekV3Config(hidden_size=E, n_routed_experts=E, num_experts_per_tok=k,
                                           n_group=n_group, topk_group=topk_group,
                                           routed_scaling_factor=scaling, norm_topk_prob=normalize)
    router = DeepseekV3TopkRouter(config).to(DEVICE)
    with torch.no_grad():
        router.weight.copy_(torch.eye(E))
        router.e_score_correction_bias.copy_(bias)
        _, w, idx = router(logits.to(DEVICE))
    return idx.cpu(), w.cpu()


def ours(tmp, logits, bias, k, n_group, topk_group, scaling, normalize, v2):
    save_file({"logits": logits.contiguous(), "bias": bias}, tmp / "in.safetensors")
    subprocess.run([REPLAY, tmp / "in.safetensors", tmp / "out.safetensors", str(k), str(n_group),
                    str(topk_group), repr(scaling), "1" if normalize else "0"] + (["cuda"] if CUDA else []) + (["softmax", "group-best"] if v2 else []),
                   check=True)
    out = load_file(tmp / "out.safetensors")
    return out["topk_idx"], out["topk_weight"]


def by_expert(idx, w):
    """Each row's (expert, weight) pairs in expert order: the chosen set, order aside."""
    order = idx.argsort(-1)
    return idx.gather(-1, order), w.gather(-1, order)


failed = []
with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    g = torch.Generator().manual_seed(0)
    for name, (E, k, n_group, topk_group, scaling, v2) in SETTINGS.items():
        for batch in ("random", "ties"):
            logits = torch.randn(N, E, generator=g) * 2
            bias = torch.randn(E, generator=g) * 0.05 * (not v2)
            if batch == "ties":  # coarse values: equal keys within and across groups
                logits = (logits * 2).round() / 2
                bias = (bias * 40).round() / 40
            keys = torch.softmax(logits, -1) if v2 else torch.sigmoid(logits) + bias
            for normalize in (False,) if v2 else (True, False):
                a_idx, a_w = by_expert(*ours(tmp, logits, bias, k, n_group, topk_group, scaling, normalize, v2))
                b_idx, b_w = by_expert(*theirs(logits, bias, E, k, n_group, topk_group, scaling, normalize, v2))
                other = (a_idx != b_idx).any(-1)
                same = ~other
                ulp = torch.finfo(torch.float32).eps * b_w[same].abs().max().item() if same.any() else 0.0
                wdiff = (a_w[same] - b_w[same]).abs().max().item() if same.any() else 0.0
                # A tie explains a row when both choices hold the same keys, or when the groups
                # tie at the edge of the kept ones (then each may keep another group).
                group = keys.view(N, n_group, E // n_group).topk(1 if v2 else min(2, E // n_group), -1)[0].sum(-1)
                g_sorted = group.sort(-1, descending=True).values
                group_tie = (g_sorted[:, topk_group - 1] == g_sorted[:, topk_group]) if n_group > topk_group \
                    else torch.zeros(N, dtype=torch.bool)
                ties_only = all(group_tie[r].item() or
                                torch.equal(keys[r].gather(0, a_idx[r]).sort().values,
                                            keys[r].gather(0, b_idx[r]).sort().values)
                                for r in other.nonzero().flatten().tolist())
                ok = wdiff <= 4 * ulp and (other.sum().item() == 0 if batch == "random" or CUDA else ties_only)
                print(f"{'ok  ' if ok else 'FAIL'} {DEVICE}: {name}, {batch}, normalise {normalize}: {N} vectors, "
                      f"{other.sum().item()} with other experts{' (each a tie at the edge)' if other.any() and ties_only else ''}, "
                      f"max |weight diff| {wdiff:.1e} ({wdiff / ulp if ulp else 0:.1f} ulp of the largest)")
                if not ok:
                    failed.append((name, batch, normalize))
if failed:
    print(f"failed: {failed}")
    sys.exit(1)
print("ok")
