#!/usr/bin/env python3
"""Inference speed on the CPU: `moe-train bench-generate` against transformers' generate on the same
model directory, device and threads.

Two random Qwen3-MoE models made here from transformers' Qwen3MoeConfig (nothing downloaded): "tiny"
(the tests' model: d 64, 3 layers, 4 experts top-2, vocabulary 320) and "small" (d 512, 4 layers,
8 query / 4 key-value heads of 64, 16 experts of 256 top-4, vocabulary 32,000). Greedy decoding of
--new tokens after random prompts of --prompt tokens, EOS ignored, at batch 1 and 8, fp32.

moe-train: its own medians (one warm-up, --rounds timed): time to first token (the prefill), prefill
tokens/s, decode tokens/s (batch x (new - 1) tokens over the decode steps' wall clock).
transformers: generate() timed with time.perf_counter, t1 with max_new_tokens=min_new_tokens=1 (time to
first token; prefill tokens/s = batch x prompt / t1) and tN with N new tokens (decode tokens/s =
batch x (N - 1) / (tN - t1)); one warm-up, medians of --rounds. Nothing is asserted.

usage: bench/generate_cpu.py MOE_TRAIN_BINARY [--threads 2] [--prompt 128] [--new 64] [--rounds 3]
"""
import argparse
import json
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
ap.add_argument("--prompt", type=int, default=128)
ap.add_argument("--new", type=int, default=64)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--batches", default="1,8")
ap.add_argument("--models", default="tiny,small")
args = ap.parse_args()
torch.set_num_threads(args.threads)
BATCHES = [int(b) for b in args.batches.split(",")]

MODELS = {
    "tiny": dict(vocab_size=320, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                 intermediate_size=80, max_position_embeddings=4096, tie_word_embeddings=False),
    "small": dict(vocab_size=32000, hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=4, head_dim=64, num_experts=16, num_experts_per_tok=4,
                  moe_intermediate_size=256, intermediate_size=1024, max_position_embeddings=4096,
                  tie_word_embeddings=False, norm_topk_prob=True),
}


def ours(model_dir):
    r = subprocess.run([args.binary, "bench-generate", "--checkpoint", str(model_dir), "--device", "cpu",
                        "--threads", str(args.threads), "--prompt-tokens", str(args.prompt),
                        "--new-tokens", str(args.new), "--batch", args.batches, "--rounds",
                        str(args.rounds), "--json"], capture_output=True, text=True, check=True)
    return {r["batch"]: r for r in json.loads(r.stdout)["results"]}


def theirs(model_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = {}
    for b in BATCHES:
        ids = torch.randint(0, model.config.vocab_size, (b, args.prompt), generator=torch.Generator().manual_seed(b))
        mask = torch.ones_like(ids)

        def timed(n):
            t0 = time.perf_counter()
            with torch.no_grad():
                model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                               do_sample=False, pad_token_id=0)
            return time.perf_counter() - t0
        timed(args.new)  # warm-up
        t1 = statistics.median(timed(1) for _ in range(args.rounds))
        tn = statistics.median(timed(args.new) for _ in range(args.rounds))
        out[b] = {"ttft_s": t1, "prefill_tokens_per_s": b * args.prompt / t1,
                  "decode_tokens_per_s": b * (args.new - 1) / (tn - t1)}
    return out


def main():
    print(f"threads {args.threads}, prompts of {args.prompt} tokens, {args.new} new (greedy), "
          f"medians of {args.rounds} rounds, torch {torch.__version__}, transformers {transformers.__version__}")
    print("| model | batch | implementation | TTFT | prefill tokens/s | decode tokens/s | decode vs transformers |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as t:
        for name in args.models.split(","):
            d = pathlib.Path(t) / name
            torch.manual_seed(1)
            transformers.AutoModelForCausalLM.from_config(
                transformers.Qwen3MoeConfig(**MODELS[name])).save_pretrained(d)
            mine, peer = ours(d), theirs(d)
            for b in BATCHES:
                for impl, r in (("moe-train", mine[b]), ("transformers", peer[b])):
                    rel = r["decode_tokens_per_s"] / peer[b]["decode_tokens_per_s"]
                    print(f"| {name} | {b} | {impl} | {1e3 * r['ttft_s']:.1f} ms | "
                          f"{r['prefill_tokens_per_s']:,.0f} | {r['decode_tokens_per_s']:,.1f} | {rel:.2f}x |")


if __name__ == "__main__":
    main()
