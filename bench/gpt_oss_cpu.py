#!/usr/bin/env python3
"""CPU step time of a gpt-oss-shaped model: moe-train against transformers' own training step.

One random GptOssForCausalLM (transformers' GptOssConfig with gpt-oss's settings: sinks, q/k/v/o
biases, alternating sliding (window 128) and full layers, YaRN, biased router, clamped SwiGLU)
at a size a 2-core machine trains in seconds, saved once and imported with `moe-train
import-hf`. Both sides then train it on the same windows (batch x seq tokens per step) with
AdamW and clipping 1.0, fp32, the same thread count: moe-train from the import
(`model.init_from`), transformers with torch.optim.AdamW on the model as loaded (eager attention,
its default for gpt-oss; experts_implementation "eager", the per-expert loop, and its default
grouped form where the installed version has one). Whole steps with the optimizer, wall clock:
moe-train's step_time_s (one step's end to the next), transformers' time.perf_counter around
zero_grad + forward + backward + clip + step. Rounds alternate the two; medians are reported.
Nothing is asserted.

usage: bench/gpt_oss_cpu.py MOE_TRAIN_BINARY [--threads 2] [--steps 10] [--warmup 3] [--rounds 3]
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import tempfile
import time

import torch
import transformers

ap = argparse.ArgumentParser()
ap.add_argument("binary")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--batch", type=int, default=2)
ap.add_argument("--seq", type=int, default=512)
args = ap.parse_args()
torch.set_num_threads(args.threads)

SHAPE = dict(vocab_size=4096, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, head_dim=32, num_local_experts=8, num_experts_per_tok=2,
             intermediate_size=256, sliding_window=128, tie_word_embeddings=False,
             pad_token_id=None, router_aux_loss_coef=0.0)


def moe_train_round(binary, tmp, imported, data):
    out = tmp / f"run-{time.monotonic_ns()}"
    cfg = {"train_micro_batch_size_per_gpu": args.batch, "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
           "model": {"seq_len": args.seq, "init_from": str(imported)},
           "moe": {"aux_loss_coeff": 0.0, "z_loss_coeff": 0.0},
           "data": {"train_path": str(data / "train.h5"), "valid_path": str(data / "valid.h5"),
                    "shuffle": False},
           "training": {"device": "cpu", "output_dir": str(out), "eval_interval": 0,
                        "train_iters": args.warmup + args.steps},
           "checkpoint": {"save_interval": 0}}
    path = tmp / "bench.json"
    path.write_text(json.dumps(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    r = subprocess.run([binary, "--config", path, "-q"], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"moe-train failed: {r.stderr[-2000:]}")
    recs = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    times = [x["step_time_s"] for x in recs if x["type"] == "train"][args.warmup:]
    return statistics.median(times)


def transformers_round(src, windows, implementation):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        src, dtype=torch.float32, experts_implementation=implementation)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    times = []
    for step in range(args.warmup + args.steps):
        rows = windows[step * args.batch:(step + 1) * args.batch]
        t0 = time.perf_counter()
        opt.zero_grad()
        logits = model(input_ids=rows[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 rows[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[args.warmup:])


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    torch.manual_seed(0)
    config = transformers.GptOssConfig(**SHAPE)
    model = transformers.AutoModelForCausalLM.from_config(config)
    src = tmp / "hf"
    model.save_pretrained(src)
    params = sum(p.numel() for p in model.parameters())
    data = tmp / "data"
    docs = (args.warmup + args.steps) * args.batch * 2
    subprocess.run([args.binary, "make-synthetic", "--out", data, "--vocab", str(SHAPE["vocab_size"]),
                    "--programs", "8", "--doc-len", str(args.seq + 1), "--train-docs", str(docs),
                    "--valid-docs", "8"], check=True, capture_output=True)
    imported = tmp / "imported"
    subprocess.run([args.binary, "import-hf", src, "--out", imported], check=True, capture_output=True)
    import h5py
    import numpy as np
    tokens = torch.from_numpy(h5py.File(data / "train.h5")["tokens"][:].astype(np.int64))
    windows = tokens[: (tokens.numel() // (args.seq + 1)) * (args.seq + 1)].view(-1, args.seq + 1)
    results = {"moe-train": [], "transformers eager experts": [], "transformers grouped experts": []}
    for rnd in range(args.rounds):
        order = list(results) if rnd % 2 == 0 else list(reversed(results))
        for name in order:
            if name == "moe-train":
                t = moe_train_round(args.binary, tmp, imported, data)
            else:
                impl = "eager" if "eager" in name else "grouped_mm"
                try:
                    t = transformers_round(src, windows, impl)
                except Exception as e:  # a transformers without this implementation
                    print(f"{name}: {type(e).__name__}: {e}")
                    continue
            results[name].append(t)
    tokens_per_step = args.batch * args.seq
    print(f"gpt-oss-shaped model: {params / 1e6:.1f} M parameters, {SHAPE['num_hidden_layers']} layers, "
          f"{SHAPE['num_local_experts']} experts top-{SHAPE['num_experts_per_tok']}, batch {args.batch} x "
          f"{args.seq} tokens, {args.threads} threads, {args.rounds} rounds of {args.steps} steps")
    base = statistics.median(results["moe-train"])
    print("| implementation | step time (median) | tokens/s | moe-train speed-up |")
    print("|---|---|---|---|")
    for name, ts in results.items():
        if not ts:
            continue
        m = statistics.median(ts)
        print(f"| {name} | {m * 1000:.1f} ms | {tokens_per_step / m:,.0f} | {m / base:.2f}x |")
    print("rounds (s):", json.dumps({k: [round(t, 4) for t in v] for k, v in results.items()}))
