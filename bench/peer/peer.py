#!/usr/bin/env python3
"""PyTorch peer of moe-train: the same MoE language model, trained from the same ds_config-style
JSON, written the way a PyTorch user would write it. It exists to be benchmarked against the C++
trainer (tokens/s, step time, peak memory); it is not a second trainer.

Same as moe-train: the architecture (token + learned position embeddings; pre-RMSNorm blocks of
causal self-attention with a fused qkv projection and an MoE feed-forward layer; fp32 softmax
(or sigmoid) top-k router with Switch load-balancing and z losses; SwiGLU experts; final RMSNorm;
tied LM head), the initialisation rules, the parameter count, the loss (cross entropy +
aux_loss_coeff * aux + z_loss_coeff * z, summed over layers), gradient accumulation, global-norm
clipping, AdamW with two parameter groups (no decay on 1-D parameters), dropout settings,
activation checkpointing of the first N blocks, and precision (CUDA: bf16 autocast, or fp16
autocast with a loss scaler; CPU: fp32).

Different on purpose: the learning rate is constant (optimizer.params.lr; moe-train's warmup and
decay schedules do not change the cost of a step), batches are read in order without shuffling,
synchronously in the training loop, and the MoE layer is the Hugging Face Mixtral-style block
(per-expert nn.Linear modules, a Python loop over experts, index_add_) rather than moe-train's
sorted dispatch. Top-k uses torch.topk (moe-train breaks exact ties towards the lower expert id).
fp16 uses torch.amp.GradScaler, not DeepSpeed's scaler. moe.capacity_factor > 0, a shared expert
and the expert bias are rejected.

`--moe grouped` is the peer a user would pick for speed (what torchtitan and Megatron-Core do):
stacked expert weights [E, d, f], sort-based dispatch (a stable argsort of the expert ids, one
gather), the three expert projections as `torch._grouped_mm` over per-expert offsets, and one
index_add_ back; with `--compile` the rest of the model is fused by torch.compile.
`--moe torchtitan` is torchtitan's own MoE layer in the same model (TitanMoeBlock: its experts
always compute in bf16, also on the CPU). bench/run's headline ratio is against the strongest
peer measured in the same run.

Usage: peer.py --config CONFIG.json [--steps N] [--warmup W] [--device cpu|cuda] [--compile]
               [--moe loop|grouped|torchtitan] [--threads T] [--json]
Relative data paths are resolved against the current directory, as moe-train does.
"""
import argparse
import dataclasses
import json
import math
import pathlib
import resource
import sys
import time

import h5py
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


# ---------------------------------------------------------------------------------------------
# Configuration: the subset of moe-train's ds_config keys that shapes the model and the step,
# with moe-train's defaults (include/moe/config/config.h).


@dataclasses.dataclass
class Config:
    train_batch_size: int
    micro_batch_size: int
    grad_accum_steps: int
    lr: float
    betas: tuple
    eps: float
    weight_decay: float
    decay_norms_and_biases: bool
    adam_without_decay: bool
    gradient_clipping: float
    bf16: bool
    fp16: bool
    vocab_size: int
    seq_len: int
    hidden_size: int
    num_layers: int
    num_heads: int
    dropout: float
    init_std: float
    norm_eps: float
    tie_embeddings: bool
    num_experts: int
    top_k: int
    expert_hidden_size: int
    score_function: str
    normalize_topk: bool
    aux_loss_coeff: float
    z_loss_coeff: float
    capacity_factor: float
    expert_dropout: float
    checkpoint_blocks: int
    data_path: str
    train_path: str
    seed: int
    device: str
    moe_impl: str = "loop"  # --moe: loop | grouped | torchtitan


def resolve_batch(tbs, mbs, gas):
    """DeepSpeed's any-two-of-three rule with world size 1 (src/config/config.cpp)."""
    if tbs and mbs and gas:
        if tbs != mbs * gas:
            sys.exit(f"train_batch_size {tbs} != micro batch {mbs} x accumulation {gas}")
    elif tbs and mbs:
        if tbs % mbs:
            sys.exit(f"train_batch_size {tbs} is not a multiple of the micro batch {mbs}")
        gas = tbs // mbs
    elif tbs and gas:
        if tbs % gas:
            sys.exit(f"train_batch_size {tbs} is not a multiple of gradient_accumulation_steps "
                     f"{gas}")
        mbs = tbs // gas
    elif mbs and gas:
        tbs = mbs * gas
    elif tbs:
        mbs, gas = tbs, 1
    elif mbs:
        tbs, gas = mbs, 1
    else:
        sys.exit("set train_batch_size or train_micro_batch_size_per_gpu")
    return tbs, mbs, gas


def load_config(path):
    j = json.loads(pathlib.Path(path).read_text())
    tbs, mbs, gas = resolve_batch(j.get("train_batch_size", 0),
                                  j.get("train_micro_batch_size_per_gpu", 0),
                                  j.get("gradient_accumulation_steps", 0))
    opt = j.get("optimizer", {})
    op = opt.get("params", {})
    m = j.get("model", {})
    e = j.get("moe", {})
    d = j.get("data", {})
    t = j.get("training", {})
    hidden = m.get("hidden_size", 256)
    ffn = e.get("expert_hidden_size", 0)
    if ffn <= 0:  # SwiGLU convention: 2/3 of 4h, rounded up to a multiple of 64
        ffn = ((8 * hidden // 3 + 63) // 64) * 64
    cfg = Config(
        train_batch_size=tbs,
        micro_batch_size=mbs,
        grad_accum_steps=gas,
        lr=op.get("lr", 1e-3),
        betas=tuple(op.get("betas", [0.9, 0.999])),
        eps=op.get("eps", 1e-8),
        weight_decay=op.get("weight_decay", 0.01),
        decay_norms_and_biases=op.get("decay_norms_and_biases", False),
        adam_without_decay=opt.get("type", "AdamW") == "Adam",
        gradient_clipping=j.get("gradient_clipping", 0.0),
        bf16=j.get("bf16", {}).get("enabled", False),
        fp16=j.get("fp16", {}).get("enabled", False),
        vocab_size=m.get("vocab_size", 256),
        seq_len=m.get("seq_len", 128),
        hidden_size=hidden,
        num_layers=m.get("num_layers", 4),
        num_heads=m.get("num_heads", 4),
        dropout=m.get("dropout", 0.0),
        init_std=m.get("init_std", 0.02),
        norm_eps=m.get("norm_eps", 1e-5),
        tie_embeddings=m.get("tie_embeddings", True),
        num_experts=e.get("num_experts", 8),
        top_k=e.get("top_k", 2),
        expert_hidden_size=ffn,
        score_function=e.get("score_function", "softmax"),
        normalize_topk=e.get("normalize_topk", True),
        aux_loss_coeff=e.get("aux_loss_coeff", 0.01),
        z_loss_coeff=e.get("z_loss_coeff", 0.001),
        capacity_factor=e.get("capacity_factor", 0.0),
        expert_dropout=e.get("expert_dropout", 0.0),
        checkpoint_blocks=j.get("activation_checkpointing", {}).get("number_checkpoints", 0),
        data_path=d.get("path", ""),
        train_path=d.get("train_path", ""),
        seed=t.get("seed", 1234),
        device=t.get("device", "auto"),
    )
    if cfg.capacity_factor > 0:
        sys.exit("moe.capacity_factor > 0 (token dropping) is not implemented by the peer")
    for key in ("shared_expert_hidden_size", "router_bias_update_rate"):
        if e.get(key, 0):
            sys.exit(f"moe.{key} is not implemented by the peer")
    if cfg.hidden_size % cfg.num_heads:
        sys.exit("model.hidden_size must be a multiple of model.num_heads")
    return cfg


# ---------------------------------------------------------------------------------------------
# Model


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg.hidden_size
        self.num_heads = cfg.num_heads
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)

    def forward(self, x):
        B, S, d = x.shape
        qkv = self.qkv(x).view(B, S, 3, self.num_heads, d // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(B, S, d))


class Expert(nn.Module):
    """One SwiGLU feed-forward network (Mixtral's MixtralBlockSparseTop2MLP)."""

    def __init__(self, cfg):
        super().__init__()
        d, f = cfg.hidden_size, cfg.expert_hidden_size
        self.w_gate = nn.Linear(d, f, bias=False)
        self.w_up = nn.Linear(d, f, bias=False)
        self.w_down = nn.Linear(f, d, bias=False)
        self.dropout = nn.Dropout(cfg.expert_dropout)

    def forward(self, x):
        return self.w_down(self.dropout(F.silu(self.w_gate(x)) * self.w_up(x)))


def router_losses(logits, scores, tokens_per_expert, sigmoid, k):
    """The Switch/GShard load-balancing loss (E * sum_e fraction of assignments to e * mean prob
    of e) and the z-loss, from fp32 router logits [T, E], their scores and the expert counts."""
    T, E = logits.shape
    probs = scores / scores.sum(-1, keepdim=True).clamp_min(1e-20) if sigmoid else scores
    aux_loss = E * (tokens_per_expert.float() / max(1, T * k) * probs.mean(0)).sum()
    z_loss = torch.logsumexp(logits, dim=-1).square().mean()
    return aux_loss, z_loss


def route(block, x):
    """Top-k routing of both MoE blocks: fp32 router (whatever the autocast dtype), softmax or
    sigmoid scores, renormalised top-k weights, per-expert counts, and the router losses."""
    E, k = block.num_experts, block.top_k
    with torch.autocast(x.device.type, enabled=False):
        logits = F.linear(x.float(), block.router.weight.float())
    scores = torch.sigmoid(logits) if block.sigmoid else logits.softmax(dim=-1)
    weights, selected = torch.topk(scores, k, dim=-1)
    if block.normalize_topk and (k > 1 or block.sigmoid):
        weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1e-20)
    tokens_per_expert = torch.bincount(selected.flatten(), minlength=E)
    aux_loss, z_loss = router_losses(logits, scores, tokens_per_expert, block.sigmoid, k)
    return weights, selected, tokens_per_expert, aux_loss, z_loss


class SparseMoeBlock(nn.Module):
    """Top-k routed experts, in the style of Hugging Face's MixtralSparseMoeBlock: route every
    token, then loop over the experts, each taking the tokens routed to it and adding its
    weighted output back with index_add_. Also returns the Switch load-balancing loss and the
    router z-loss of the layer."""

    def __init__(self, cfg):
        super().__init__()
        self.num_experts = cfg.num_experts
        self.top_k = cfg.top_k
        self.sigmoid = cfg.score_function == "sigmoid"
        self.normalize_topk = cfg.normalize_topk
        self.router = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(cfg) for _ in range(cfg.num_experts))

    def forward(self, x):  # x: [tokens, hidden]
        T, d = x.shape
        E = self.num_experts
        weights, selected, _, aux_loss, z_loss = route(self, x)
        out = torch.zeros(T, d, dtype=torch.float32, device=x.device)  # accumulate in fp32
        expert_mask = F.one_hot(selected, num_classes=E).permute(2, 1, 0)  # [E, k, T]
        for e, expert in enumerate(self.experts):
            slot, token = torch.where(expert_mask[e])
            if token.numel() == 0:
                continue
            y = expert(x[token]).float() * weights[token, slot, None]
            out.index_add_(0, token, y)
        return out.to(x.dtype), aux_loss, z_loss


class GroupedMoeBlock(nn.Module):
    """The same routed experts as grouped GEMMs: stacked weights, assignments sorted by expert
    (stable: token order within an expert), torch._grouped_mm over the experts' row offsets, the
    weighted outputs added back per token in fp32. No per-expert Python loop, no host sync."""

    def __init__(self, cfg):
        super().__init__()
        E, d, f = cfg.num_experts, cfg.hidden_size, cfg.expert_hidden_size
        self.num_experts, self.top_k = E, cfg.top_k
        self.sigmoid = cfg.score_function == "sigmoid"
        self.normalize_topk = cfg.normalize_topk
        self.router = nn.Linear(d, E, bias=False)
        self.w_gate = nn.Parameter(torch.empty(E, d, f))
        self.w_up = nn.Parameter(torch.empty(E, d, f))
        self.w_down = nn.Parameter(torch.empty(E, f, d))
        self.dropout = nn.Dropout(cfg.expert_dropout)

    def forward(self, x):  # x: [tokens, hidden]
        T, d = x.shape
        k = self.top_k
        weights, selected, tokens_per_expert, aux_loss, z_loss = route(self, x)
        order = torch.argsort(selected.flatten(), stable=True)
        token = order // k
        offs = tokens_per_expert.cumsum(0).to(torch.int32)
        # _grouped_mm is not on autocast's lists: cast to the compute dtype ourselves.
        dt = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) \
            else x.dtype
        rows = x[token].to(dt)
        h = F.silu(torch._grouped_mm(rows, self.w_gate.to(dt), offs=offs)) * \
            torch._grouped_mm(rows, self.w_up.to(dt), offs=offs)
        y = torch._grouped_mm(self.dropout(h), self.w_down.to(dt), offs=offs)
        y = y.float() * weights.flatten()[order, None]
        out = torch.zeros(T, d, dtype=torch.float32, device=x.device).index_add_(0, token, y)
        return out.to(x.dtype), aux_loss, z_loss


class TitanMoeBlock(nn.Module):
    """torchtitan's own MoE layer (torchtitan.models.common.moe.MoE, pinned 0.3.0 in
    scripts/setup): its fp32 top-k router, LocalTokenDispatcher and GroupedExperts (the three
    projections as torch._grouped_mm in bf16, also under fp16 autocast and on the CPU), at the
    config's shape, its auxiliary-loss-free bias off; moe.expert_dropout is refused. torchtitan leaves the load-balancing and z losses to its trainer; they are computed
    here from its router's logits and choices (forward hooks), as the other blocks compute them,
    so every peer does the same work."""

    def __init__(self, cfg):
        super().__init__()
        try:
            from torchtitan.models.common.linear import Linear
            from torchtitan.models.common.moe import (MoE, GroupedExperts, RoutedExperts,
                                                      TokenChoiceTopKRouter)
            from torchtitan.models.common.token_dispatcher import LocalTokenDispatcher
        except ImportError as e:
            sys.exit(f"--moe torchtitan: torchtitan's MoE layer is not importable ({e}); "
                     "scripts/setup installs it")
        if cfg.expert_dropout > 0:
            sys.exit("--moe torchtitan: moe.expert_dropout > 0 is not part of torchtitan's MoE layer")
        E, d, f, k = cfg.num_experts, cfg.hidden_size, cfg.expert_hidden_size, cfg.top_k
        self.num_experts, self.top_k = E, k
        self.sigmoid = cfg.score_function == "sigmoid"
        self.moe = MoE.Config(
            num_experts=E,
            routed_experts=RoutedExperts.Config(
                inner_experts=GroupedExperts.Config(dim=d, hidden_dim=f, num_experts=E),
                token_dispatcher=LocalTokenDispatcher.Config(num_experts=E, top_k=k)),
            router=TokenChoiceTopKRouter.Config(
                num_experts=E, gate=Linear.Config(in_features=d, out_features=E), top_k=k,
                score_func=cfg.score_function,
                route_norm=cfg.normalize_topk and (k > 1 or self.sigmoid)),
            load_balance_coeff=None).build()
        self._seen = {}
        self.moe.router.gate.register_forward_hook(
            lambda module, args, out: self._seen.__setitem__("logits", out))
        self.moe.router.register_forward_hook(
            lambda module, args, out: self._seen.__setitem__("selected", out[1]))

    def forward(self, x):  # x: [tokens, hidden]
        T, d = x.shape
        out = self.moe(x.view(1, T, d)).view(T, d)
        logits = self._seen.pop("logits").view(T, self.num_experts).float()
        selected = self._seen.pop("selected").view(T, self.top_k)
        scores = torch.sigmoid(logits) if self.sigmoid else logits.softmax(dim=-1)
        tokens_per_expert = torch.bincount(selected.flatten(), minlength=self.num_experts)
        aux_loss, z_loss = router_losses(logits, scores, tokens_per_expert, self.sigmoid,
                                         self.top_k)
        return out, aux_loss, z_loss


MOE_BLOCKS = {"loop": "SparseMoeBlock", "grouped": "GroupedMoeBlock", "torchtitan": "TitanMoeBlock"}


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.attn = CausalSelfAttention(cfg)
        self.moe_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.moe = globals()[MOE_BLOCKS[cfg.moe_impl]](cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        x = x + self.dropout(self.attn(self.attn_norm(x)))
        B, S, d = x.shape
        y, aux_loss, z_loss = self.moe(self.moe_norm(x).reshape(B * S, d))
        return x + self.dropout(y.view(B, S, d)), aux_loss, z_loss


class MoeLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.pos_embed = nn.Embedding(cfg.seq_len, cfg.hidden_size)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.final_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.lm_head = None
        if not cfg.tie_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.checkpoint_blocks = cfg.checkpoint_blocks
        self.init_weights(cfg)

    @torch.no_grad()
    def init_weights(self, cfg):
        # moe-train's rules: normal(init_std); residual-output projections (attention out,
        # expert w_down; torchtitan's w2) scaled by 1/sqrt(2 * num_layers); router (torchtitan's
        # gate) xavier-uniform; norms ones.
        std, out_std = cfg.init_std, cfg.init_std / math.sqrt(2.0 * cfg.num_layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                continue  # RMSNorm weights stay ones
            if name.endswith(("router.weight", "router.gate.weight")):
                nn.init.xavier_uniform_(p)
            elif name.endswith(("attn.out.weight", "w_down.weight", "moe.w_down", "w2_EDF")):
                nn.init.normal_(p, 0.0, out_std)
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(self, tokens):
        S = tokens.shape[1]
        x = self.embed(tokens) + self.pos_embed(torch.arange(S, device=tokens.device))
        aux_loss = z_loss = 0.0
        for i, block in enumerate(self.blocks):
            if self.training and i < self.checkpoint_blocks and torch.is_grad_enabled():
                x, aux, z = checkpoint(block, x, use_reentrant=False)
            else:
                x, aux, z = block(x)
            aux_loss, z_loss = aux_loss + aux, z_loss + z
        x = self.final_norm(x)
        logits = self.lm_head(x) if self.lm_head is not None else F.linear(x, self.embed.weight)
        return logits, aux_loss, z_loss


# ---------------------------------------------------------------------------------------------
# Data: non-overlapping seq_len + 1 token windows of every training shard, in order, cycling.


def train_shards(cfg):
    if cfg.data_path:
        root = pathlib.Path(cfg.data_path)
        manifest = json.loads((root / "manifest.json").read_text())
        return [root / s["file"] for s in manifest["splits"]["train"]]
    if not cfg.train_path:
        sys.exit("config: set data.path or data.train_path")
    p = pathlib.Path(cfg.train_path)
    return sorted(p.glob("*.h5")) if p.is_dir() else [p]


class WindowReader:
    def __init__(self, paths, cfg):
        self.window = cfg.seq_len + 1
        self.shards = []
        for path in paths:
            f = h5py.File(path, "r")
            if f.attrs.get("vocab_size", 0) > cfg.vocab_size:
                sys.exit(f"data: {path}: shard vocab_size {f.attrs['vocab_size']} exceeds "
                         f"model.vocab_size {cfg.vocab_size}")
            tokens = f["tokens"]
            if tokens.shape[0] // self.window > 0:
                self.shards.append((tokens, tokens.shape[0] // self.window))
        if not self.shards:
            sys.exit(f"data: no shard holds a window of {self.window} tokens")
        self.shard, self.position = 0, 0

    def next_batch(self, n):
        """[n, seq_len + 1] int64 windows, read as contiguous slices."""
        parts = []
        while n > 0:
            tokens, windows = self.shards[self.shard]
            take = min(n, windows - self.position)
            start = self.position * self.window
            parts.append(tokens[start:start + take * self.window])
            self.position += take
            n -= take
            if self.position == windows:
                self.shard, self.position = (self.shard + 1) % len(self.shards), 0
        batch = np.concatenate(parts).astype(np.int64).reshape(-1, self.window)
        return torch.from_numpy(batch)


# ---------------------------------------------------------------------------------------------
# Training


def make_optimizer(model, cfg):
    decay, no_decay = [], []
    for p in model.parameters():
        (decay if p.dim() >= 2 or cfg.decay_norms_and_biases else no_decay).append(p)
    weight_decay = 0.0 if cfg.adam_without_decay else cfg.weight_decay
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    kwargs = dict(lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    try:
        return torch.optim.AdamW(groups, fused=True, **kwargs), "fused"
    except RuntimeError:  # no fused kernel for this device: the default (foreach)
        return torch.optim.AdamW(groups, **kwargs), "foreach"


def peak_memory_bytes(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="ds_config-style JSON, as for moe-train")
    ap.add_argument("--steps", type=int, default=10, help="timed optimizer steps (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    ap.add_argument("--device", choices=["cpu", "cuda"],
                    help="default: training.device, and for 'auto' cuda when available")
    ap.add_argument("--compile", action="store_true", help="wrap the model in torch.compile")
    ap.add_argument("--moe", choices=sorted(MOE_BLOCKS), default="loop",
                    help="loop: HF Mixtral-style per-expert loop; grouped: stacked weights + "
                         "torch._grouped_mm (the fast peer); torchtitan: torchtitan's own MoE "
                         "layer (bf16 grouped GEMMs)")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: PyTorch's)")
    ap.add_argument("--json", action="store_true", help="print one JSON line as the result")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0:
        sys.exit("--steps must be >= 1 and --warmup >= 0")

    log = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    cfg = load_config(args.config)
    cfg.moe_impl = args.moe
    if args.threads:
        torch.set_num_threads(args.threads)
    name = args.device or cfg.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: this PyTorch sees no CUDA device")
    device = torch.device(name)
    bf16 = device.type == "cuda" and cfg.bf16
    fp16 = device.type == "cuda" and cfg.fp16
    if device.type == "cpu" and (cfg.bf16 or cfg.fp16):
        log("bf16/fp16 enabled but running on the CPU: computing in fp32")
    amp_dtype = torch.bfloat16 if bf16 else torch.float16

    torch.manual_seed(cfg.seed)
    model = MoeLM(cfg).to(device)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    optimizer, adamw_impl = make_optimizer(model, cfg)
    scaler = torch.amp.GradScaler(device.type, enabled=fp16)
    step_model = torch.compile(model) if args.compile else model
    reader = WindowReader(train_shards(cfg), cfg)
    max_norm = cfg.gradient_clipping if cfg.gradient_clipping > 0 else float("inf")
    log(f"model: {params} parameters; device {device}, "
        f"{'bf16' if bf16 else 'fp16' if fp16 else 'fp32'}, AdamW {adamw_impl}, "
        f"{torch.get_num_threads()} threads, batch {cfg.train_batch_size} = "
        f"{cfg.micro_batch_size} x {cfg.grad_accum_steps}, seq_len {cfg.seq_len}"
        f"{', torch.compile' if args.compile else ''}")

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        lm_sum = 0.0
        for _ in range(cfg.grad_accum_steps):
            batch = reader.next_batch(cfg.micro_batch_size)
            if device.type == "cuda":
                batch = batch.pin_memory()
            batch = batch.to(device, non_blocking=True)
            inputs, targets = batch[:, :-1], batch[:, 1:]
            with torch.autocast(device.type, dtype=amp_dtype, enabled=bf16 or fp16):
                logits, aux_loss, z_loss = step_model(inputs)
                lm_loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                          targets.reshape(-1))
                loss = lm_loss + cfg.aux_loss_coeff * aux_loss + cfg.z_loss_coeff * z_loss
            scaler.scale(loss / cfg.grad_accum_steps).backward()
            lm_sum = lm_sum + lm_loss.detach()
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()
        return (lm_sum / cfg.grad_accum_steps).item(), grad_norm.item()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for i in range(args.warmup):
        t0 = time.perf_counter()
        loss, grad_norm = train_step()
        log(f"warmup {i + 1}/{args.warmup}: loss {loss:.4f} grad_norm {grad_norm:.3f} "
            f"{time.perf_counter() - t0:.3f} s")
    sync()
    start = time.perf_counter()
    for i in range(args.steps):
        t0 = time.perf_counter()
        loss, grad_norm = train_step()  # .item() inside: the step has finished on the device
        log(f"step {i + 1}/{args.steps}: loss {loss:.4f} grad_norm {grad_norm:.3f} "
            f"{time.perf_counter() - t0:.3f} s")
    sync()
    seconds = time.perf_counter() - start

    tokens_per_s = args.steps * cfg.train_batch_size * cfg.seq_len / seconds
    result = {
        "impl": {"loop": "pytorch", "grouped": "pytorch-grouped",
                 "torchtitan": "torchtitan-moe"}[cfg.moe_impl] +
                ("-compile" if args.compile else "-eager"),
        "config": args.config,
        "device": str(device),
        "steps": args.steps,
        "tokens_per_s": tokens_per_s,
        "step_s": seconds / args.steps,
        "peak_mem_bytes": peak_memory_bytes(device),
        "params": params,
        "loss": loss,
        "threads": torch.get_num_threads(),
    }
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        print(f"{tokens_per_s:,.0f} tokens/s, {seconds / args.steps:.4f} s/step over "
              f"{args.steps} steps; peak memory {result['peak_mem_bytes'] / 2**20:.1f} MiB; "
              f"final loss {loss:.4f}")


if __name__ == "__main__":
    main()
