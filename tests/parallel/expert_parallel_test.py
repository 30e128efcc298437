"""Expert parallelism on torch.distributed (Gloo on 127.0.0.1), launched by torchrun and by hand:

  - EP=2 on 2 processes vs 1 process on the same global batch, 30 steps: per-step losses,
    gradient norms, aux losses and per-expert token counts agree to <= 1e-5 relative, dropless
    and with a capacity limit (moe.capacity_factor 1.0, the routers rank every rank's
    assignments together); with activation checkpointing, accumulation, a shared expert, the
    aux-loss-free bias and a dense layer; plain data parallelism with the capacity limit too;
  - EP=2 x DP=2 on 4 processes vs 1 process, 20 steps: the same, dropless and with capacity, and
    with ZeRO stages 1 and 2 (the experts' state shared out over their replicas);
  - a gpt-oss-shaped model (biases, sinks, sliding windows, softmax after top-k, clamped
    SwiGLU): EP=2 and DP=2 on 2 processes vs 1 process, 15 steps, the same bar;
  - a DeepSeek-V3 / GLM-4.5-shaped model (sigmoid group-limited routing with the correction
    bias, routed scaling, a shared expert, a dense first layer, q/k/v biases, q/k norms, partial
    rotary): EP=2 and DP=2 vs 1 process, 15 steps, the same bar; its EP=2 checkpoint in the
    single-process names and shapes; and the same routing under DeepSeek-V3's multi-head latent
    attention, EP=2 and DP=2;
  - resume EP=2 -> EP=1, EP=1 -> EP=2 and EP=2 ZeRO-2 -> EP=2 ZeRO-1 at step 20 of 40 continues
    the straight run's losses;
  - the checkpoint's tensors (model and optimizer) have the single-process names and shapes,
    and values within 1e-4 of a single process's at the same step; its Hugging Face export
    initialises EP=2 and one process alike (model.init_from);
  - one rank killed inside an expert all-to-all (MOE_TEST_DIE_IN_ALL_TO_ALL): the other exits 3
    within distributed.timeout_s naming the all-to-all, no hang;
  - bad sizes: expert_parallel_size not dividing num_experts or the world: exit 2 naming the key.

usage: expert_parallel_test.py MOE_TRAIN_BINARY
"""
import functools
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import launch

BIN = sys.argv[1]
TORCHRUN = launch.TORCHRUN
RTOL = 1e-5
CONFIG = {**launch.SMALL_CONFIG, "training": {**launch.SMALL_CONFIG["training"], "eval_interval": 10}}
free_port = launch.free_port
torchrun = functools.partial(launch.torchrun, BIN)
single = functools.partial(launch.single, BIN)


def records(run_dir):
    recs = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r["type"] == "train"]


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def worst(a, b, counts=True):
    """Worst relative difference of loss, grad norm, aux loss and every expert's token count."""
    assert [x["step"] for x in a] == [y["step"] for y in b], "the same steps"
    w = 0.0
    for x, y in zip(a, b):
        w = max(w, rel(x["loss"], y["loss"]), rel(x["grad_norm"], y["grad_norm"]),
                rel(x["aux_loss"], y["aux_loss"]))
        if counts:
            for lx, ly in zip(x["expert_tokens"], y["expert_tokens"]):
                w = max(w, max(rel(p, q) for p, q in zip(lx, ly)))
    return w


def shapes(path):
    from safetensors import safe_open
    with safe_open(str(path), "pt") as f:
        return {k: f.get_slice(k).get_shape() for k in f.keys()}


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    cfg = tmp / "ep.json"
    CONFIG["data"] = launch.make_data(BIN, tmp)
    cfg.write_text(json.dumps(CONFIG))
    EP2 = "moe.expert_parallel_size=2"
    CAP = "moe.capacity_factor=1.0"

    # Bad sizes: one line naming the key, exit 2, before any rank trains.
    r = subprocess.run([TORCHRUN, "--no-python", "--nproc-per-node", "2", "--master-port", str(free_port()),
                        BIN, "--config", cfg, "-q", "--set", "moe.expert_parallel_size=3",
                        "--set", f"training.output_dir={tmp / 'bad'}"], capture_output=True, text=True)
    assert r.returncode != 0 and "moe.expert_parallel_size = 3: must divide moe.num_experts (4)" in r.stderr, r.stderr[-2000:]
    r = subprocess.run([BIN, "config", "show", "--config", cfg, "--set", "moe.num_experts=8", "--set",
                        "moe.expert_parallel_size=4"], capture_output=True, text=True,
                       env={**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    assert r.returncode == 2 and "must divide the world size (2 processes)" in r.stderr, r.stderr[-2000:]
    assert not (tmp / "bad").exists(), "nothing written"
    print("bad expert_parallel_size: exit 2 naming the key")

    t0 = time.time()
    for name, extra in (("dropless", []), ("capacity", [CAP])):
        single(cfg, f"training.output_dir={tmp / f'one-{name}'}", *extra)
        one = records(tmp / f"one-{name}")
        torchrun(cfg, 2, f"training.output_dir={tmp / f'ep2-{name}'}", EP2, *extra)
        w = worst(records(tmp / f"ep2-{name}"), one)
        dropped = sum(r.get("dropped_tokens", 0) for r in one)
        print(f"EP=2 on 2 processes vs 1 process, {name}, 30 steps: worst relative difference of loss, "
              f"grad norm, aux loss and expert token counts {w:.1e}" + (f" ({dropped} assignments dropped)" if extra else ""))
        assert w <= RTOL, (name, w)
    # What users combine with EP: activation checkpointing (the all-to-all runs again in the
    # recompute), accumulation micro-steps, a shared expert (replicated, not spread), the
    # aux-loss-free expert bias (updated from the global loads) and dense first layer.
    mix = ["activation_checkpointing.number_checkpoints=2", "train_batch_size=16", "gradient_accumulation_steps=2",
           "moe.shared_expert_hidden_size=64", "moe.router_bias_update_rate=0.001", "moe.mlp_only_layers=[0]",
           "model.num_layers=3", "training.train_iters=15"]
    single(cfg, *mix, f"training.output_dir={tmp / 'mix-one'}")
    torchrun(cfg, 2, EP2, *mix, f"training.output_dir={tmp / 'mix-ep2'}")
    w = worst(records(tmp / "mix-ep2"), records(tmp / "mix-one"))
    print(f"EP=2 with activation checkpointing, 2 accumulation steps, a shared expert, the expert bias and a "
          f"dense layer, 15 steps: {w:.1e}")
    assert w <= RTOL, w
    # A gpt-oss-shaped model: attention biases and sinks, sliding and full layers, router and
    # expert biases, softmax after the top-k, the clamped SwiGLU; EP=2 and plain DP=2.
    oss = ["model.rope_theta=150000", "model.num_key_value_heads=2", "model.attention_bias=true",
           "model.attention_sinks=true", "model.sliding_window=16",
           'model.layer_types=["sliding_attention","full_attention"]', "moe.router_bias=true",
           "moe.expert_bias=true", "moe.softmax_after_topk=true", "moe.activation=clamped_swiglu",
           "training.train_iters=15"]
    single(cfg, *oss, f"training.output_dir={tmp / 'oss-one'}")
    for name, extra in (("EP=2", [EP2]), ("DP=2", [])):
        out = tmp / f"oss-{name[:2].lower()}"
        torchrun(cfg, 2, *oss, *extra, f"training.output_dir={out}")
        w = worst(records(out), records(tmp / "oss-one"))
        print(f"gpt-oss-shaped model, {name} on 2 processes vs 1 process, 15 steps: {w:.1e}")
        assert w <= RTOL, (name, w)
    # A DeepSeek-V3 / GLM-4.5-shaped model: sigmoid scores with the correction bias updated from
    # the global loads, 8 experts in 4 groups of which 2 are kept, routed_scaling_factor 2.5, a
    # shared expert, a dense first layer, q/k/v biases, q/k norms and rotary on half of each head;
    # EP=2 (4 experts per rank) and plain DP=2 against one process, and the EP=2 checkpoint in the
    # single-process names and shapes.
    v3 = ["moe.num_experts=8", "moe.score_function=sigmoid", "moe.n_group=4", "moe.topk_group=2",
          "moe.routed_scaling_factor=2.5", "moe.router_bias_update_rate=0.001", "moe.shared_expert_hidden_size=64",
          "moe.mlp_only_layers=[0]", "model.num_layers=3", "model.qkv_bias=true", "model.qk_norm=true",
          "model.rope_theta=10000", "model.partial_rotary_factor=0.5", "training.train_iters=15",
          "checkpoint.save_interval=15"]
    single(cfg, *v3, f"training.output_dir={tmp / 'v3-one'}")
    for name, extra in (("EP=2", [EP2]), ("DP=2", [])):
        out = tmp / f"v3-{name[:2].lower()}"
        torchrun(cfg, 2, *v3, *extra, f"training.output_dir={out}")
        w = worst(records(out), records(tmp / "v3-one"))
        print(f"DeepSeek-V3/GLM-4.5-shaped model, {name} on 2 processes vs 1 process, 15 steps: {w:.1e}")
        assert w <= RTOL, (name, w)
    for f in ("model.safetensors", "optimizer.safetensors"):
        ep, one = (tmp / f"v3-{r}/checkpoints/step-00000015/{f}" for r in ("ep", "one"))
        assert shapes(ep) == shapes(one), f"DeepSeek-V3-shaped EP=2 checkpoint {f}: names and shapes"
    print("  its EP=2 checkpoint: the single-process names and shapes")
    # DeepSeek-V3 itself: the same routing under multi-head latent attention (a query bottleneck,
    # the kv latent and shared rotary key, interleaved rotary pairs) instead of GLM's attention.
    mla = [o for o in v3 if not o.startswith(("model.qkv_bias", "model.qk_norm",
                                              "model.partial_rotary_factor"))]
    mla += ["model.kv_lora_rank=16", "model.q_lora_rank=24", "model.qk_nope_head_dim=16",
            "model.qk_rope_head_dim=8", "model.v_head_dim=12", "model.rope_interleave=true"]
    single(cfg, *mla, f"training.output_dir={tmp / 'mla-one'}")
    for name, extra in (("EP=2", [EP2]), ("DP=2", [])):
        out = tmp / f"mla-{name[:2].lower()}"
        torchrun(cfg, 2, *mla, *extra, f"training.output_dir={out}")
        w = worst(records(out), records(tmp / "mla-one"))
        print(f"DeepSeek-V3-shaped model with latent attention, {name} on 2 processes vs 1 process, "
              f"15 steps: {w:.1e}")
        assert w <= RTOL, (name, w)
    torchrun(cfg, 2, f"training.output_dir={tmp / 'dp2-capacity'}", CAP)
    w = worst(records(tmp / "dp2-capacity"), records(tmp / "one-capacity"))
    print(f"data parallel 2 x 4 vs 1 x 8 with capacity factor 1.0 (global capacity ranking): {w:.1e}")
    assert w <= RTOL, w
    print(f"  ({time.time() - t0:.1f} s)")

    t0 = time.time()
    for name, extra in (("dropless", []), ("capacity", [CAP])):
        single(cfg, "training.train_iters=20", f"training.output_dir={tmp / f'one20-{name}'}", *extra)
        torchrun(cfg, 4, "training.train_iters=20", f"training.output_dir={tmp / f'ep2dp2-{name}'}", EP2, *extra)
        w = worst(records(tmp / f"ep2dp2-{name}"), records(tmp / f"one20-{name}"))
        print(f"EP=2 x DP=2 on 4 processes vs 1 process, {name}, 20 steps: {w:.1e}")
        assert w <= RTOL, (name, w)
    # ZeRO with expert parallelism: the experts' Adam state shared out over their replicas, the
    # rest over the world; the checkpoint gathers both into the single-process layout.
    from safetensors.torch import load_file
    for stage in (1, 2):
        out = tmp / f"ep2dp2-zero{stage}"
        torchrun(cfg, 4, "training.train_iters=20", f"training.output_dir={out}", EP2,
                 f"zero_optimization.stage={stage}")
        w = worst(records(out), records(tmp / "one20-dropless"))
        z = load_file(str(out / "checkpoints/step-00000020/optimizer.safetensors"))
        o = load_file(str(tmp / "one20-dropless/checkpoints/step-00000020/optimizer.safetensors"))
        assert z.keys() == o.keys() and all(z[k].shape == o[k].shape for k in z), "optimizer layout"
        diff = max(((z[k] - o[k]).abs().max() / o[k].abs().max().clamp_min(1e-30)).item() for k in z)
        print(f"EP=2 x DP=2 with ZeRO stage {stage} vs 1 process, 20 steps: {w:.1e}; gathered Adam state "
              f"within {diff:.1e} of one process's")
        assert w <= RTOL and diff <= 1e-4, (stage, w, diff)
    print(f"  ({time.time() - t0:.1f} s)")

    # The checkpoint holds the single-process tensors: names, shapes, values.
    one_ck, ep_ck = tmp / "one-dropless/checkpoints/step-00000030", tmp / "ep2-dropless/checkpoints/step-00000030"
    for f in ("model.safetensors", "optimizer.safetensors"):
        assert shapes(ep_ck / f) == shapes(one_ck / f), f
    from safetensors.torch import load_file
    diff = 0.0
    for f in ("model.safetensors", "optimizer.safetensors"):
        a, b = load_file(str(ep_ck / f)), load_file(str(one_ck / f))
        diff = max(diff, max(((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-30)).item() for k in a))
    n_expert = sum(".moe.experts." in k for k in shapes(ep_ck / "model.safetensors"))
    print(f"checkpoint of EP=2: single-process names and shapes ({n_expert} expert tensors, whole), "
          f"max relative difference to 1 process {diff:.1e}")
    assert diff <= 1e-4, diff

    t0 = time.time()
    straight = tmp / "straight"
    single(cfg, "training.train_iters=40", f"training.output_dir={straight}")
    run = lambda ep, *sets: torchrun(cfg, 2, EP2, *sets) if ep == 2 else single(cfg, *sets)
    for first, then in ((2, 1), (1, 2)):
        out = tmp / f"resume-{first}-{then}"
        sets = ["training.train_iters=40", f"training.output_dir={out}"]
        run(first, *sets, "training.exit_interval=20")
        run(then, *sets)
        w = worst(records(out), records(straight))
        print(f"resume EP={first} -> EP={then} at step 20 of 40 vs straight: {w:.1e}")
        assert w <= RTOL, (first, then, w)
    # ZeRO shares across a resume: EP=2 with ZeRO-2 writes, EP=2 with ZeRO-1 reads its own share.
    out = tmp / "resume-zero"
    sets = ["training.train_iters=40", f"training.output_dir={out}"]
    torchrun(cfg, 2, EP2, *sets, "zero_optimization.stage=2", "training.exit_interval=20")
    torchrun(cfg, 2, EP2, *sets, "zero_optimization.stage=1")
    w = worst(records(out), records(straight))
    print(f"resume EP=2 ZeRO-2 -> EP=2 ZeRO-1 at step 20 of 40 vs straight: {w:.1e}")
    assert w <= RTOL, w
    print(f"  ({time.time() - t0:.1f} s)")

    # A pretrained Hugging Face model as model.init_from: each EP rank fills its experts' rows
    # (the checkpoint of an EP=2 run, exported to a MixtralForCausalLM directory).
    rope = ["model.rope_theta=10000", "training.train_iters=6"]
    torchrun(cfg, 2, EP2, *rope, f"training.output_dir={tmp / 'pre'}")
    subprocess.run([BIN, "export-hf", tmp / "pre/checkpoints/step-00000006", "--out", tmp / "hf"], check=True,
                   capture_output=True)
    init = [*rope, f"model.init_from={tmp / 'hf'}"]
    single(cfg, *init, f"training.output_dir={tmp / 'hf-one'}")
    torchrun(cfg, 2, EP2, *init, f"training.output_dir={tmp / 'hf-ep2'}")
    w = worst(records(tmp / "hf-ep2"), records(tmp / "hf-one"))
    first = records(tmp / "hf-one")[0]["loss"]
    print(f"model.init_from a Hugging Face export of an EP=2 run: EP=2 vs 1 process {w:.1e} "
          f"(first loss {first:.4f})")
    assert w <= RTOL, w

    # One rank dies inside its 41st all-to-all (during step 3 or 4); the other is waiting in its
    # own and must give up, not hang.
    out = tmp / "kill"
    port = free_port()
    sets = [f"training.output_dir={out}", EP2, "training.train_iters=1000"]
    procs = [launch.by_hand(BIN, cfg, port, 0, *sets),
             launch.by_hand(BIN, cfg, port, 1, *sets, env={"MOE_TEST_DIE_IN_ALL_TO_ALL": "41"})]
    _, err1 = procs[1].communicate(timeout=300)
    t_kill = time.time()
    _, err = procs[0].communicate(timeout=CONFIG["distributed"]["timeout_s"] + 30)
    waited = time.time() - t_kill
    assert procs[1].returncode == -9, (procs[1].returncode, err1[-1000:])
    assert procs[0].returncode == 3 and "rank 0 of 2: all-to-all failed" in err, (procs[0].returncode, err[-2000:])
    assert waited <= CONFIG["distributed"]["timeout_s"], waited
    print(f"rank 1 killed in its 41st all-to-all: rank 0 exited 3 after {waited:.1f} s: "
          f"{err.strip().splitlines()[-1][:200]}")
print("ok")
