#!/usr/bin/env python3
"""The runner of scripts/gpu-check: options, step budgets, the GPU test steps (moe_gpu_tests watched
test by test, reruns of only the tests after one that crashed or hung), the two training runs with
their peak memory against `moe-train plan`, the summary and the packing. The steps that shape the
machine (env, deps, configure, build) and the two plain commands (bench, full-ctest) stay shell
functions in scripts/gpu-check; this program calls them one at a time (`scripts/gpu-check --step
NAME`) and carries their exported variables to the next step. Standard library only: the GPU
machine has a bare python3. Usage: the comment at the top of scripts/gpu-check (`--help`).
"""
from __future__ import annotations

import datetime
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent
SCRIPT = SRC / "scripts" / "gpu-check"

# name, budget (s), who runs it ("sh": a function of scripts/gpu-check), in run order. The default
# steps' budgets plus SUMMARY_S make PLAN_S: one run stays within 8 min 35 s of the GPU machine's
# time, and its command's timeout (DEVICE_MARGIN_S more) within 10. bench gives way first: its
# budget (None) is what the other steps leave of PLAN_S, and at run time it gets whatever the steps
# before it left unused (skipped under FLEX_MIN_S). full-ctest is opt-in, not counted.
# Why these figures: configure took ~11 s and the build of the three GPU targets 74-97 s on the
# 2026-11-30 H200 (the sources have grown by half since); gpu-tests is GPU_SUITES' estimate plus
# room for the reruns; the two training runs are start-up (LibTorch, CUDA context, 1.1 B parameters
# built on the device, data) plus their steps at the 1 B bench's speed (0.17 s a step; offload adds
# ~1 s a step of host AdamW over 1.1 B parameters and pins 17 GiB of host buffers). The 4-bit
# dequantization suites' 5 s and the 4-bit LoRA run's 4 s came out of configure's room (30 -> 21
# s, measured 11 s): the plan was full (bench at 0 s). The clamped-SwiGLU suites' 3 s took 2 s
# more of it (21 -> 19 s) and 1 s of the reruns' room. The 2026-12-04 H200 measured deps 3.8 s,
# configure 8.3 s, build 102.5 s, gpu-tests 28.8 s, memcheck 6.9 s, racecheck 4.4 s, lora-bf16
# 23.1 s, offload-1b 25.8 s: deps 25 -> 15, build 180 -> 150, gpu-tests 101 -> 70 (the suites
# re-estimated below), the sanitizers 30 -> 20 each; the 91 s freed go to bench, which took
# 106.6 s for one round and the profiled step (the steps before it leave the rest unused).
# qlora-nf4 (2026-12-04, not yet run on a device): 35 s like lora-bf16, taken from bench's
# leftovers (91 -> 56 s; bench's own follow-up call is `--only deps,bench`).
# lora-mla (2026-12-05, not yet run on a device): 35 s like lora-bf16, and gpu-tests 70 -> 80 s
# for the latent-attention and router-group suites, both from bench's leftovers (56 -> 11 s:
# bench is skipped in the default call and runs in its own follow-up, `--only deps,bench`).
# lora-gemma4 (2026-12-07, not yet run on a device): 35 s like lora-mla; nothing was left to take
# it from, so the plan grows 480 -> 515 s (the command's timeout 575 s, within one call's 600).
STEP_TABLE = [("env", 15, "sh"), ("deps", 15, "sh"), ("configure", 19, "sh"), ("build", 150, "sh"),
              ("gpu-tests", 80, "py"), ("memcheck", 20, "py"), ("racecheck", 20, "py"),
              ("lora-bf16", 35, "py"), ("qlora-nf4", 35, "py"), ("lora-mla", 35, "py"),
              ("lora-gemma4", 35, "py"), ("offload-1b", 40, "py"),
              ("bench", None, "sh"),
              ("full-ctest", 300, "sh")]
PLAN_S = 515          # the default steps and the summary: 8 min 35 s
SUMMARY_S = 5         # summary.md and --pack, after the last step
FLEX_MIN_S = 30       # bench is not started with less (bench/run's first round needs about that)
DEVICE_MAX_S = 600    # the longest one command may run on the GPU machine
DEVICE_MARGIN_S = 60  # its timeout beyond our budget: start-up, and the files' way back
MAX_FILES = 8         # the GPU machine sends back at most this many files of OUTDIR
# Small shapes only, none of which skips on a device: edge cases (1 token, 1 expert), a k > 1 case
# per dtype family, the row kernels' packed (unrolled k = 8) and per-element (two chunks) shapes,
# the dispatch plan small and at T 4096 / E 256, the router with softmax and with sigmoid scores
# and with expert groups (8 experts in 4 groups), the poison test, the rotary kernel on a strided view with documents, the SwiGLU kernel's
# packed form (rows of [gate | up]) with 16-byte packs and with one element per thread and with
# the GeGLU gate, and the
# 8-bit AdamW kernel one value past a block, and the 4-bit dequantization with one byte per thread
# (odd n, double quant) and with 16-byte packs, the MXFP4 dequantization with 16-byte packs and
# with one byte per thread (every code and scale byte), and the clamped SwiGLU with one element
# per thread and misaligned. Every kernel family of src/kernels/*.cu is in it.
# gtest's '*' also matches '/' and '.'.
SAN_FILTER = ("Grid/PermuteGpu.*/fp32_T7_E8_k2:Grid/PermuteGpu.*/bf16_T7_E64_k8:"
              "Shapes/PermuteGpu.*/bf16_T33_E16_k8_d1000:Shapes/PermuteGpu.*/fp16_T33_E16_k10_d3:"
              "Grid/PermuteGpu.*/fp16_T1_E1_k1:PlanGrid/DispatchPlanGpu.*/T7_E8_k2:"
              "PlanGrid/DispatchPlanGpu.*/T4096_E256_k8:Grid/RouterGpu.*/fp32_T7_E8_k2:"
              "Grid/RouterGpu.*/fp32_T7_E64_k8_sigmoid:Groups/RouterGroupGpu.*/tiny:"
              "PermuteGpuPoison.*:"
              "Grid/RotaryGpu.*/bf16_B2_N3_S5_hd6_view_docs:"
              "Grid/SwigluGpu.*/bf16_33x1024_packed:Grid/SwigluGpu.*/fp32_3x5_packed:"
              "Grid/SwigluGpu.*/geglu_fp16_3x5_packed:"
              "Grid/Adam8bitGpu.*/n4097_scale1_wd1_t3:"
              "Grid/Dequant4bitGpu.*/nf4_dq_bf16_33x65:Grid/Dequant4bitGpu.*/fp4_fp32_5x100:"
              "Grid/DequantMxfp4Gpu.*/random_bf16_7x33:"
              "Grid/DequantMxfp4Gpu.*/codes_fp16_256_misaligned:"
              "Grid/ClampedSwigluGpu.*/bf16_33x1024_misaligned:Grid/ClampedSwigluGpu.*/fp32_3x5")
MAX_CRASH_RERUNS = 3  # reruns after a crash or a hang, per gpu-tests step

# moe_gpu_tests by suite: (cases, estimated seconds for all of them on an H200): 1.5 x what each
# suite took on the 2026-12-04 H200 (the gpu-tests log's measured column; 26.7 s for 833 cases in
# one process), rounded up to 0.5 s, at least 0.5 s; suites added since are estimated from what
# they do. The step logs each suite's time next to its estimate for the next plan.
GPU_SUITES = {
    "Grid/PermuteGpu": (120, 14.0), "Shapes/PermuteGpu": (210, 2.0),        # 9.2 s, 1.2 s
    "PlanGrid/DispatchPlanGpu": (40, 1.5), "PermuteGpuPoison": (1, 1.0), "KernelArgsGpu": (1, 0.5),
    "Grid/RouterGpu": (200, 7.5), "RouterGpuRules": (2, 1.0), "RouterGpuArgs": (1, 0.5),  # 4.8 s
    # The router's expert groups (DeepSeek-V3 / GLM-4.5 / V2): 18 cases, the largest 4096 tokens
    # x 256 experts with the reference's sorts on the device and the CPU; the Router module twice
    # (not yet run on a device: estimated from Grid/RouterGpu's time per case, doubled).
    "Groups/RouterGroupGpu": (18, 3.0), "RouterGroupGpuModule": (1, 0.5),
    "TinyStepGpu": (1, 3.0), "ExpertsGpu": (3, 2.0),                        # 1.7 s, 1.2 s
    "CudaGraphGpu": (1, 1.0),               # two training runs, one of them captured: 0.4 s
    "NcclGpu": (2, 4.0),                    # two process groups: 2.4 s
    "MomentPrecisionGpu": (2, 1.0),         # one training run
    "LoraGpu": (2, 2.0),                    # two training runs (bf16 base, 4-bit base): 1.3 s
    "SixteenBitWeightsGpu": (2, 1.0),       # two training runs
    "Grid/Adam8bitGpu": (6, 0.5),
    "OffloadGradientStreamGpu": (2, 1.0),   # two offloaded training runs
    "ChunkedLmLossGpu": (1, 0.5), "StepTraceGpu": (1, 0.5),
    "Grid/RotaryGpu": (61, 0.5), "RotaryAttentionGpu": (1, 1.5),
    # SwiGLU's 44 cases (0.7 s measured) and GeGLU's 43 (2026-12-07, not yet run on a device:
    # estimated as SwiGLU's); the FFN suite's GeGLU test: three experts paths and a dense FFN.
    "Grid/SwigluGpu": (87, 2.0), "SwigluGpuAutograd": (1, 0.5), "SwigluFfnGpu": (3, 1.0),
    "RmsNormGpu": (2, 0.5),
    "Grid/Dequant4bitGpu": (96, 0.5), "Dequant4bitGpuDispatch": (1, 0.5),
    # MXFP4 (gpt-oss's experts): 27 elementwise cases, the largest 737 k values; one dispatch test.
    "Grid/DequantMxfp4Gpu": (27, 0.5), "DequantMxfp4GpuDispatch": (1, 0.5),
    # gpt-oss's clamped SwiGLU: 25 elementwise cases, three autograd tests.
    "Grid/ClampedSwigluGpu": (25, 1.0), "ClampedSwigluGpuAutograd": (3, 0.5),
    # gpt-oss's sinks and windows through SDPA vs the eager reference, fp32 and bf16, forward and
    # backward: six small cases (not yet measured; SDPA's first calls pick kernels).
    "Masks/AttentionCoreGpu": (6, 2.0),
    # cpu_checkpointing: two small training steps, checkpoints on the device and on the host.
    "ActivationCheckpointGpu": (1, 1.0),
    # Latent attention (DeepSeek-V2/V3): fp32 against the CPU module, and 8192 tokens at V3's
    # head widths in bf16 (never run on a device yet: estimated like the attention suites).
    "QueryBottleneck/LatentAttentionGpu": (2, 2.0),
    "LatentAttentionGpuMemory": (1, 2.0),
    # The expert offload ring (2026-12-07, not yet run on a device): 8 layers of 8 MiB through 2
    # pinned-to-device slots, 96 small GEMMs, and the grouped form once.
    "OffloadRingGpu": (2, 1.5),
}
GPU_TESTS_START_S = 5.0  # loading LibTorch twice (the list, the run) and one CUDA context
RERUN_START_S = 3.0      # a rerun loads LibTorch and makes a CUDA context again
UNKNOWN_SUITE_S = 5.0    # a suite not in GPU_SUITES yet counts this much in the plan
TEST_STALL_S = 45        # a test without a result for this long is hung (the longest: ~10 s)
POLL_S = 0.2             # how often the test output is read while a test binary runs
MIN_RERUN_S = 5          # no rerun is started with less left in the step


# The training runs after the test steps: the 1 B bench shape (configs/bench-gpu-1b.json: d 2048,
# 16 layers, 8 experts top-2, micro-batch 8 x 2048, bf16) as LoRA over a frozen bf16 base
# (configs/finetune-lora.json's adapters; the base is randomly initialised, there is no
# checkpoint on the GPU machine) and with the optimizer offloaded to pinned host memory.
@dataclass(frozen=True)
class TrainRun:
    config: str
    sets: tuple[str, ...]
    steps: int
    warmup: int  # the first steps' records are left out of tokens/s
    what: str


LORA_MODULES = '["q_proj","k_proj","v_proj","o_proj","gate_proj","up_proj","down_proj"]'
MLA_LORA_MODULES = ('["q_proj","kv_a_proj_with_mqa","kv_b_proj","o_proj","gate_proj","up_proj",'
                    '"down_proj"]')
TRAIN_RUNS = {
    "lora-bf16": TrainRun("configs/bench-gpu-1b.json",
                          ("lora.r=16", "lora.lora_alpha=32", "lora.lora_dropout=0.0",
                           f"lora.target_modules={LORA_MODULES}"), 30, 3,
                          "LoRA r 16 over a bf16 base"),
    # The same LoRA over a 4-bit base (nf4 + double quant, issue 49): the dequantization before
    # each GEMM, its scratch, and the planner's 4-bit tier against the device's peak.
    "qlora-nf4": TrainRun("configs/bench-gpu-1b.json",
                          ("lora.r=16", "lora.lora_alpha=32", "lora.lora_dropout=0.0",
                           f"lora.target_modules={LORA_MODULES}", "quantization.load_in_4bit=true",
                           "quantization.bnb_4bit_quant_type=nf4",
                           "quantization.bnb_4bit_use_double_quant=true",
                           "quantization.bnb_4bit_compute_dtype=bfloat16"), 30, 3,
                          "LoRA r 16 over an nf4 + double-quant base"),
    # Moonlight-16B-A3B's layers (DeepSeek-V3 family, issue 48): latent attention without a query
    # bottleneck (16 heads, q/k 128 + 64, v 128, kv latent 512), 64 experts of 1408 top-6 plus
    # two shared, the first layer dense (11264), sigmoid routing; 8 of its 27 layers, the bench
    # data's 32,000-token vocabulary. LoRA on every latent projection and the routed experts.
    "lora-mla": TrainRun("configs/bench-gpu-moonlight.json",
                         ("lora.r=16", "lora.lora_alpha=32", "lora.lora_dropout=0.0",
                          f"lora.target_modules={MLA_LORA_MODULES}"), 30, 3,
                         "LoRA r 16 on a Moonlight-shaped latent-attention model"),
    # Gemma-4-26B-A4B's layers (issue 66): five sliding layers and one full-attention layer of
    # head_dim 512 (K = V, 2 kv heads), which flash and cuDNN SDPA cannot take: the log must name
    # the kernel that ran it. A dense GeGLU MLP beside 128 GeGLU experts top-8; LoRA on q/k/v/o
    # and the routed experts.
    "lora-gemma4": TrainRun("configs/bench-gpu-gemma4.json",
                            ("lora.r=16", "lora.lora_alpha=32", "lora.lora_dropout=0.0",
                             f"lora.target_modules={LORA_MODULES}"), 30, 3,
                            "LoRA r 16 on a Gemma-4-26B-A4B-shaped model"),
    "offload-1b": TrainRun("configs/bench-gpu-1b.json",
                           ("zero_optimization.offload_optimizer.device=cpu",
                            "zero_optimization.offload_optimizer.pin_memory=true"), 8, 2,
                           "optimizer offloaded"),
}
PLAN_BAR = 0.15  # the memory plan's bar against measured peaks (docs/memory.md)


class UsageError(Exception):
    """Bad arguments: one line, exit 2."""


# --- options -------------------------------------------------------------------------------------
@dataclass
class Options:
    outdir: Path = Path()
    dry_run: bool = False
    build: Path = SRC / "build-gpu"
    skip_build: bool = False
    full_ctest: bool = False
    budget: int | None = None
    cuda_arch: str = "90"
    pack: bool = False
    only: list[str] = field(default_factory=list)
    pass_args: list[str] = field(default_factory=list)  # repeated in the GPU machine's command


def usage() -> str:
    lines = SCRIPT.read_text().splitlines()[1:]
    out = []
    for line in lines:
        if line.startswith("set -euo"):
            break
        out.append(re.sub(r"^# ?", "", line))
    return "\n".join(out) + "\n"


def parse_args(argv: list[str]) -> Options:
    o = Options()
    names = [n for n, _, _ in STEP_TABLE]
    outdir = ""
    i = 0

    def value(what: str) -> str:
        if i + 1 >= len(argv) or argv[i + 1] == "":
            raise UsageError(f"{argv[i]} needs {what}")
        return argv[i + 1]

    while i < len(argv):
        a = argv[i]
        if a == "--dry-run":
            o.dry_run = True
        elif a == "--build-dir":
            v = value("a directory")
            o.build = Path(v)
            o.pass_args += [a, v]
            i += 1
        elif a == "--skip-build":
            o.skip_build = True
            o.pass_args.append(a)
        elif a == "--full-ctest":
            o.full_ctest = True
            o.pass_args.append(a)
        elif a == "--budget":
            v = value("seconds")
            if not re.fullmatch(r"[0-9]+", v):
                raise UsageError("--budget takes whole seconds")
            o.budget = int(v)
            i += 1
        elif a == "--cuda-arch":
            o.cuda_arch = value("a value")
            o.pass_args += [a, o.cuda_arch]
            i += 1
        elif a == "--pack":
            o.pack = True
        elif a == "--only":
            v = value("step names")
            for s in v.split(","):
                if s and s not in names:
                    raise UsageError(f"no step '{s}' (steps: {','.join(names)})")
            o.only = [s for s in v.split(",") if s]
            if "full-ctest" in o.only:
                o.full_ctest = True
            o.pass_args += [a, v]
            i += 1
        elif a in ("-h", "--help"):
            sys.stdout.write(usage())
            sys.exit(0)
        elif a.startswith("-"):
            raise UsageError(f"unknown option {a} (see --help)")
        else:
            if outdir:
                raise UsageError("one OUTDIR only")
            outdir = a
        i += 1
    if not outdir:
        sys.stderr.write(usage())
        sys.exit(2)
    o.outdir = Path(outdir) if os.path.isabs(outdir) else SRC / outdir
    o.build = o.build if o.build.is_absolute() else SRC / o.build
    return o


# --- which steps, and their budgets --------------------------------------------------------------
@dataclass
class Plan:
    selected: list[tuple[str, int, str]]  # (name, budget, runner); a flexible step's planned budget
    off: list[str]                        # full-ctest when not asked for
    flexible: list[str]                   # steps that give way: they get what is left
    steps_s: int
    total_s: int
    budget: int
    budget_given: bool


def step_budgets() -> dict[str, int | None]:
    """STEP_TABLE's budgets; GPU_CHECK_STEP_BUDGETS=name=S,name=S overrides some (trials, tests)."""
    table = {name: secs for name, secs, _ in STEP_TABLE}
    for item in filter(None, os.environ.get("GPU_CHECK_STEP_BUDGETS", "").split(",")):
        name, _, secs = item.partition("=")
        if name not in table or not re.fullmatch(r"[0-9]+", secs):
            raise UsageError(f"GPU_CHECK_STEP_BUDGETS: '{item}' is not STEP=SECONDS with a step of "
                             f"{','.join(table)}")
        table[name] = int(secs)
    return table


def make_plan(o: Options) -> Plan:
    budgets = step_budgets()
    chosen, off = [], []
    for name, _, runner in STEP_TABLE:
        if o.only and name not in o.only:
            continue
        if name == "full-ctest" and not o.full_ctest:
            off.append(name)
            continue
        chosen.append((name, budgets[name], runner))
    flexible = [name for name, secs, _ in chosen if secs is None]
    fixed = sum(secs for _, secs, _ in chosen if secs is not None)
    # What gives way plans on what the fixed steps leave of PLAN_S (full-ctest is beyond it).
    opt_in = sum(secs for name, secs, _ in chosen if name == "full-ctest")
    left = max(0, PLAN_S - SUMMARY_S - (fixed - opt_in))
    selected = [(name, left if secs is None else secs, runner) for name, secs, runner in chosen]
    steps_s = sum(secs for _, secs, _ in selected)
    total = steps_s + SUMMARY_S
    budget = o.budget if o.budget is not None else total
    if budget <= SUMMARY_S:
        raise UsageError(f"--budget must exceed the summary's {SUMMARY_S}s")
    return Plan(selected, off, flexible, steps_s, total, budget, o.budget is not None)


def step_timeout(budget: int, left: int, later: int) -> int | None:
    """A step's timeout: its budget plus what earlier steps left unused, as long as the later steps
    keep their full budgets; None when it cannot get its full budget (skipped, never started short:
    it would fail for want of time and say nothing about the code)."""
    if left < budget:
        return None
    return max(budget, left - later)


def flexible_timeout(left: int, later: int) -> int | None:
    """A step that gives way (bench): whatever the later steps leave; None under FLEX_MIN_S."""
    t = left - later
    return t if t >= FLEX_MIN_S else None


# --- commands ------------------------------------------------------------------------------------
def quote(args: list[str]) -> str:
    """As a shell would read them back: plain words bare, others in single quotes (as the shell
    functions print them)."""
    out = []
    for a in args:
        if re.fullmatch(r"[A-Za-z0-9_./=:,+@%^-]+", a):
            out.append(a)
        else:
            out.append("'" + a.replace("'", "'\\''") + "'")
    return " ".join(out)


def find_tool(name: str, fallback: str = "") -> str:
    p = shutil.which(name) or ""
    if not p and fallback and os.access(fallback, os.X_OK):
        p = fallback
    return p


def now_iso() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


class Step:
    """One step's context: its log, its end time, what it reports."""

    def __init__(self, run: "Runner", name: str, end: float, log):
        self.run, self.name, self.end, self.log = run, name, end, log
        self.skip = ""  # set: counted as skipped, with this reason
        self.key = ""   # the summary's key figure

    def say(self, text: str) -> None:
        if self.run.o.dry_run:
            print(text)
        else:
            self.log.write(text + "\n")
            self.log.flush()

    def left(self) -> int:
        return int(self.end - time.time())

    def log_size(self) -> int:
        """Where the log ends now: the programs a step runs write into it directly."""
        self.log.flush()
        return os.fstat(self.log.fileno()).st_size

    def log_text(self, start: int = 0) -> str:
        self.log.flush()
        with open(self.log.name, "rb") as f:
            f.seek(start)
            return f.read().decode(errors="replace")

    def _announce(self, args: list[str], note: str = "") -> int | None:
        """Echoes the command (a dry run: prints it); the seconds left, None when none are."""
        if self.run.o.dry_run:
            print("  " + quote(args))
            return None
        left = self.left()
        if left <= 0:
            self.say(f"!! [{time.strftime('%H:%M:%S')}] no time left for: {quote(args)}")
            return None
        self.say(f"+ [{time.strftime('%H:%M:%S')}] {quote(args)}   (timeout {left}s{note})")
        return left

    def x(self, args: list[str], env: dict | None = None) -> int:
        """Runs args under the step's remaining time, echoing it first (TERM 3 s before the end,
        KILL at it); in a dry run prints it. Returns the exit status, 124 on a timeout and
        128 + N for a signal, as the shell reports them."""
        left = self._announce(args)
        if left is None:
            return 0 if self.run.o.dry_run else 124
        cmd = ["timeout", "-k", "3", str(left - 3 if left > 4 else 1)] + args
        rc = subprocess.run(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                            env=env or self.run.env).returncode
        rc = 128 - rc if rc < 0 else rc
        if rc in (124, 137):
            self.say(f"!! timed out after {left}s")
        return rc

    def capture(self, args: list[str]) -> tuple[int, str]:
        """As x, but what the program prints on stdout is returned, not logged."""
        left = self._announce(args)
        if left is None:
            return (0 if self.run.o.dry_run else 124), ""
        cmd = ["timeout", "-k", "3", str(left - 3 if left > 4 else 1)] + args
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=self.log, env=self.run.env)
        rc = 128 - p.returncode if p.returncode < 0 else p.returncode
        return rc, p.stdout.decode(errors="replace")

    def x_watched(self, args: list[str], stall_s: float) -> tuple[int, str]:
        """Runs a googletest binary, its output going to the log as it comes and read back as it
        goes: when no test has started or ended for stall_s seconds (a hung test), or the step's
        time is up, the process group gets TERM, then KILL 3 s later. Returns (exit status, why):
        why is "stall" or "timeout" when ended so (status 124), else ""."""
        left = self._announce(args, f"; a test without a result for {stall_s:g}s is ended")
        if left is None:
            return (0, "") if self.run.o.dry_run else (124, "timeout")
        pos = self.log_size()
        proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=self.run.env,
                                start_new_session=True)  # its own group: TERM reaches its children
        last_event, partial, why = time.time(), b"", ""
        with open(self.log.name, "rb") as out:
            while True:
                try:
                    rc = proc.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                out.seek(pos)
                chunk = out.read()
                pos += len(chunk)
                lines = (partial + chunk).split(b"\n")
                partial = lines.pop()
                if any(RUN_RE.match(line.decode(errors="replace")) or
                       RESULT_RE.match(line.decode(errors="replace")) for line in lines):
                    last_event = time.time()
                now = time.time()
                if now >= self.end - 3:
                    why = "timeout"
                elif now - last_event >= stall_s:
                    why = "stall"
                if why:
                    end_group(proc)
                    rc = 124
                    break
        rc = 128 - rc if rc < 0 else rc
        if why == "timeout":
            self.say(f"!! [{time.strftime('%H:%M:%S')}] the step's time is up: ended")
        elif why == "stall":
            self.say(f"!! [{time.strftime('%H:%M:%S')}] no test started or ended for "
                     f"{stall_s:g}s: ended")
        return rc, why


def end_group(proc: subprocess.Popen) -> None:
    """TERM to the process's group, KILL 3 s later if it is still there."""
    for sig, wait in ((signal.SIGTERM, 3), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# --- gtest verdicts ------------------------------------------------------------------------------
@dataclass
class GtestResult:
    ran: int | None = None  # None: no result file (a crash or a timeout before the end)
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    failed_names: list[str] = field(default_factory=list)
    skipped_names: list[str] = field(default_factory=list)

    def figure(self) -> str:
        ran = "?" if self.ran is None else self.ran
        return f"{self.passed} passed, {self.failed} failed, {self.skipped} skipped of {ran}"


def read_gtest_xml(path: Path) -> GtestResult:
    """The outcome googletest wrote (--gtest_output=xml): every test case that ran, passed,
    failed (a <failure> element) or skipped (result="skipped" or a <skipped> element)."""
    r = GtestResult()
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return r
    r.ran = 0
    for case in root.iter("testcase"):
        if case.get("status", "run") != "run":
            continue  # DISABLED_ tests
        r.ran += 1
        name = f"{case.get('classname')}.{case.get('name')}"
        if case.find("failure") is not None:
            r.failed += 1
            r.failed_names.append(name)
        elif case.get("result") == "skipped" or case.find("skipped") is not None:
            r.skipped += 1
            r.skipped_names.append(name)
        else:
            r.passed += 1
    return r


def last_started(log_text: str) -> str:
    """The test a crashed gtest process was in: the last "[ RUN      ] Suite.Name" of its output."""
    found = re.findall(r"^\[ RUN      \] (\S+)", log_text, re.M)
    return found[-1] if found else ""


# googletest's console lines, printed (and flushed) as each test starts and ends: what a crash or a
# kill leaves behind, since the XML is written at the end only. A result line carries the test's
# time, "(12 ms)"; the end-of-run listings of failed and skipped tests carry none (not counted
# twice). A failed parameterised test reads "[  FAILED  ] P/S.N/x, where GetParam() = ... (3 ms)".
RUN_RE = re.compile(r"^\[ RUN      \] (\S+)")
RESULT_RE = re.compile(r"^\[ +(OK|FAILED|SKIPPED) +\] ([^\s,]+).*\((\d+) ms\)\s*$")
STATUS = {"OK": "passed", "FAILED": "failed", "SKIPPED": "skipped"}


def console_results(log_text: str) -> dict[str, tuple[str, int]]:
    """Each test that ended, in the order they ended: name -> (passed/failed/skipped, ms)."""
    out = {}
    for line in log_text.splitlines():
        m = RESULT_RE.match(line)
        if m:
            out[m.group(2)] = (STATUS[m.group(1)], int(m.group(3)))
    return out


def unfinished_test(log_text: str) -> str:
    """The test that started and never ended (the process died or was ended in it), or ""."""
    running = ""
    for line in log_text.splitlines():
        m = RUN_RE.match(line)
        if m:
            running = m.group(1)
            continue
        m = RESULT_RE.match(line)
        if m and m.group(2) == running:
            running = ""
    return running


def parse_test_list(text: str) -> list[str]:
    """--gtest_list_tests, in run order: "Suite." lines (a "# TypeParam" comment may follow), then
    "  Name" lines ("  # GetParam() = ..." may follow); full names are Suite.Name."""
    names, suite = [], ""
    for line in text.splitlines():
        if line.startswith("  ") and suite and line.strip():
            names.append(suite + line.split()[0])
        else:
            m = re.match(r"^(\S+\.)(\s+#.*)?$", line)
            suite = m.group(1) if m else ""
    return names


def gtest_verdict(rc: int, r: GtestResult, what: str, last_run: str = "") -> tuple[bool, str]:
    """(passed, key figure). Fails when the run did not finish, ran nothing, failed, skipped
    anything (on the GPU machine nothing may skip: a skip means no device was visible or the
    kernels were not built), or exited non-zero anyway."""
    if r.ran is None:
        timeout = ", timeout" if rc in (124, 137) else ""
        started = f"; last test started: {last_run}" if last_run else ""
        return False, f"{what}no gtest summary (exit {rc}{timeout}){started}"
    key = what + r.figure()
    if r.ran == 0:
        return False, key + " (no test selected)"
    if r.failed:
        key += "; failed: " + ", ".join(r.failed_names[:3])
    if r.skipped:
        key += "; skipped (no device, or no kernels built?): " + ", ".join(r.skipped_names[:3])
    if r.failed or r.skipped:
        return False, key
    if rc != 0:
        return False, f"{key}; exit {rc}"
    return True, key


# --- the GPU test steps --------------------------------------------------------------------------
def tests_bin(o: Options) -> Path:
    return o.build / "tests" / "moe_gpu_tests"


def gpu_test_suites(src: Path) -> dict[str, int]:
    """moe_gpu_tests' suites from its sources (the files tests/CMakeLists.txt names): TEST and
    TEST_F suites with their number of tests; each INSTANTIATE_TEST_SUITE_P as Prefix/Fixture with
    0 (its cases come from a generator)."""
    cmake = (src / "tests" / "CMakeLists.txt").read_text()
    m = re.search(r"add_executable\(moe_gpu_tests\s+([^)]*)\)", cmake)
    suites: dict[str, int] = {}
    for f in (m.group(1).split() if m else []):
        path = src / "tests" / f
        text = path.read_text() if path.is_file() else ""
        for suite in re.findall(r"^\s*TEST(?:_F)?\(\s*(\w+)\s*,", text, re.M):
            suites[suite] = suites.get(suite, 0) + 1
        instantiated = r"INSTANTIATE_TEST_SUITE_P\(\s*(\w+)\s*,\s*(\w+)\s*,"
        for prefix, fixture in re.findall(instantiated, text):
            suites[f"{prefix}/{fixture}"] = 0
    return suites


def gpu_tests_estimate(suites: dict[str, int]) -> tuple[float, list[str]]:
    """Seconds for one run of every suite (GPU_SUITES; UNKNOWN_SUITE_S for one not there yet) and
    the suites without an estimate."""
    unknown = [s for s in suites if s not in GPU_SUITES]
    secs = GPU_TESTS_START_S + sum(GPU_SUITES[s][1] if s in GPU_SUITES else UNKNOWN_SUITE_S
                                   for s in suites)
    return secs, unknown


def gpu_tests_plan_lines(budget: int) -> list[str]:
    """The dry run's account of the gpu-tests budget, suite by suite."""
    suites = gpu_test_suites(SRC)
    secs, unknown = gpu_tests_estimate(suites)
    lines = [f"moe_gpu_tests by suite, from the sources ({len(suites)} suites): cases, estimated s"]
    for s in suites:
        cases, est = GPU_SUITES.get(s, (suites[s] or "?", UNKNOWN_SUITE_S))
        lines.append(f"  {s:<28} {cases:>5} {est:>6.1f}" + ("" if s in GPU_SUITES else
                                                             "   (no estimate yet)"))
    lines.append(f"  {'LibTorch, CUDA context':<28} {'':>5} {GPU_TESTS_START_S:>6.1f}")
    reruns = MAX_CRASH_RERUNS * RERUN_START_S
    fits = "fits" if secs + reruns <= budget else "DOES NOT FIT"
    lines.append(f"  {'total':<28} {sum(GPU_SUITES.get(s, (0,))[0] for s in suites):>5} "
                 f"{secs:>6.1f}   + {MAX_CRASH_RERUNS} reruns' start-up {reruns:.0f} s: "
                 f"{secs + reruns:.0f} s, {fits} in {budget} s")
    if unknown:
        lines.append(f"  !! no estimate for {', '.join(unknown)}: add it to GPU_SUITES in "
                     "scripts/gpu_check_runner.py")
    return lines


def stall_seconds() -> float:
    return float(os.environ.get("GPU_CHECK_TEST_STALL_S") or TEST_STALL_S)


@dataclass
class Broken:
    """A test that ended its process: crashed (a signal, an abort) or hung (ended by us)."""
    name: str
    kind: str    # crashed, hung
    detail: str  # exit 139; no result after 45 s; cut at the step's end


def gpu_tests_verdict(listed: list[str], results: dict[str, tuple[str, int]], broken: list[Broken],
                      last_rc: int, finished: bool, runs: int) -> tuple[bool, str]:
    """(passed, key figure) of the gpu-tests step from every run's console results. It passes when
    every listed test ran and passed (none may skip on the GPU machine: a skip means no device was
    visible or the kernels were not built), no test crashed or hung, and the last run ended by
    itself with exit 0."""
    by = {st: [n for n, (s, _) in results.items() if s == st] for st in STATUS.values()}
    gone = {b.name for b in broken}
    total = len(listed) if listed else len(results) + len(gone - set(results))
    not_run = [t for t in listed if t not in results and t not in gone]
    parts = [f"{len(by['passed'])} passed, {len(by['failed'])} failed, {len(by['skipped'])} "
             f"skipped of {total}"]
    for b in broken:
        parts.append(f"{b.kind}: {b.name or '(between tests)'} ({b.detail})")
    if not_run:
        why = "reruns used up" if runs > MAX_CRASH_RERUNS else "no time left"
        parts.append(f"not run: {len(not_run)} ({why}), from {not_run[0]}")
    if runs > 1:
        parts.append(f"{runs} runs")
    if by["failed"]:
        parts.append("failed: " + ", ".join(by["failed"][:3]))
    if by["skipped"]:
        parts.append("skipped (no device, or no kernels built?): " + ", ".join(by["skipped"][:3]))
    if not results and not broken:
        parts.append("no test ran")
    if finished and last_rc != 0 and not by["failed"]:
        parts.append(f"exit {last_rc}")  # e.g. a crash after the last test
    ok = (bool(results) and not by["failed"] and not by["skipped"] and not broken and not not_run
          and finished and last_rc == 0)
    return ok, "; ".join(parts)


def suite_times(listed: list[str], results: dict[str, tuple[str, int]]) -> list[str]:
    """The log's table: each suite's cases and measured seconds next to its estimate."""
    rows: dict[str, list] = {}
    for name in listed or list(results):
        rows.setdefault(name.split(".")[0], [0, 0, 0.0])[0] += 1
    for name, (status, ms) in results.items():
        row = rows.setdefault(name.split(".")[0], [0, 0, 0.0])
        row[1] += 1
        row[2] += ms / 1000
    lines = [f"# {'suite':<28} {'listed':>6} {'ended':>6} {'s':>7} {'estimate':>8}"]
    for suite, (n, ended, secs) in rows.items():
        est = GPU_SUITES.get(suite, (0, UNKNOWN_SUITE_S))[1]
        lines.append(f"# {suite:<28} {n:>6} {ended:>6} {secs:>7.1f} {est:>8.1f}")
    return lines


def step_gpu_tests(s: Step) -> bool:
    """moe_gpu_tests (tests/kernels/*, the GPU suites of tests/moe, train, dist, monitor, model) in
    one process: ctest would start one per test case, each loading LibTorch and creating a CUDA
    context (seconds each, hundreds of cases). The tests are listed first; each test's result is
    read from the console as it ends. A test that kills the process (2026-11-30: one SIGSEGV hid
    360 of 368 tests) or hangs (no result for TEST_STALL_S; at the step's end, whatever is left) is
    named, and only the tests after it run again (--gtest_filter with their names), at most
    MAX_CRASH_RERUNS times: what finished is kept either way."""
    o = s.run.o
    binary = tests_bin(o)
    if not o.dry_run and not os.access(binary, os.X_OK):
        s.key = f"no {binary} (build failed or skipped)"
        return False
    base = [str(binary), "--gtest_brief=0", "--gtest_color=no"]
    stall = stall_seconds()
    if o.dry_run:
        s.x(base + ["--gtest_list_tests"])
        s.x(base + [f"--gtest_output=xml:{o.outdir / 'gpu-tests.xml'}"])
        print(f"  # a test without a result for {stall:g} s is hung; after a crash or a hang only "
              f"the tests after it run again,\n  # --gtest_filter=<their names> "
              f"(gpu-tests-N.xml), at most {MAX_CRASH_RERUNS} times")
        for line in gpu_tests_plan_lines(s.run.plan_budget(s.name)):
            print("  # " + line)
        return True
    rc, listing = s.capture(base + ["--gtest_list_tests"])
    listed = parse_test_list(listing) if rc == 0 else []
    s.say(f"# {len(listed)} tests listed" if listed else
          f"# no test list (exit {rc}): a rerun leaves out the tests that ran")
    results: dict[str, tuple[str, int]] = {}
    broken: list[Broken] = []
    flt, runs, last_rc, finished = "", 0, 0, False
    while True:
        runs += 1
        xml = o.outdir / ("gpu-tests.xml" if runs == 1 else f"gpu-tests-{runs}.xml")
        start = s.log_size()
        last_rc, why = s.x_watched(base + ([f"--gtest_filter={flt}"] if flt else []) +
                                   [f"--gtest_output=xml:{xml}"], stall)
        text = s.log_text(start)
        results.update(console_results(text))
        current = unfinished_test(text)
        if why == "timeout":  # in a test, or stuck before the first or after the last
            broken.append(Broken(current, "hung", "cut at the step's end"))
            break
        if why == "stall":
            broken.append(Broken(current, "hung", f"no result after {stall:g} s"))
            if not current:
                break  # stuck before the first test or after the last: a rerun would be too
        elif current:
            broken.append(Broken(current, "crashed", f"exit {last_rc}"))
        else:
            finished = True  # ended by itself, passed or not
            break
        # Only the tests after the one that broke, by name, in the listed order; without a list,
        # everything but what already ran.
        if current in listed:
            rest = [t for t in listed[listed.index(current) + 1:] if t not in results]
            flt = ":".join(rest)
            if not rest:
                finished, last_rc = True, 0
                break
        else:
            flt = "-" + ":".join(list(results) + [b.name for b in broken if b.name])
            rest = []
        if runs > MAX_CRASH_RERUNS:
            s.say(f"# {MAX_CRASH_RERUNS} reruns done: no more")
            break
        if s.left() < MIN_RERUN_S:
            s.say(f"# {s.left()} s left: no rerun")
            break
        s.say(f"# {current or 'the run'} {broken[-1].kind} ({broken[-1].detail}): "
              f"{len(rest) if rest else 'the remaining'} tests after it run again")
    for line in suite_times(listed, results):
        s.say(line)
    ok, s.key = gpu_tests_verdict(listed, results, broken, last_rc, finished, runs)
    return ok


def kernel_names(src: Path) -> list[str]:
    """Our kernels, from the sources: racecheck looks at these only (shared-memory hazards in
    library kernels are not ours to fix), and a renamed kernel stays covered."""
    names = set()
    for cu in sorted((src / "src" / "kernels").glob("*.cu")):
        text = re.sub(r"__launch_bounds__\([^)]*\)", "", cu.read_text())
        names.update(re.findall(r"__global__\s+void\s+([A-Za-z_][A-Za-z0-9_]*)", text))
    return sorted(names)


def sanitizer(s: Step, tool: str, extra: list[str]) -> bool:
    """compute-sanitizer on a few small cases; fails as gpu-tests does (a skipped or unselected
    case, e.g. after a rename, must not pass unchecked) and on any sanitizer error (exit 86)."""
    o = s.run.o
    cs = find_tool("compute-sanitizer", "/usr/local/cuda/bin/compute-sanitizer")
    if not cs:
        s.skip = "compute-sanitizer not found"
        if not o.dry_run:
            return True
        cs = "compute-sanitizer"  # a dry run still shows the command
    binary = tests_bin(o)
    if not o.dry_run and not os.access(binary, os.X_OK):
        s.key = f"no {binary} (build failed or skipped)"
        return False
    filt = os.environ.get("GPU_CHECK_SAN_FILTER", SAN_FILTER)
    xml = o.outdir / f"{tool}.xml"
    # The XML path goes through the environment (gtest reads GTEST_OUTPUT), so that the command
    # stays the one the dry run prints.
    env = dict(s.run.env, GTEST_OUTPUT=f"xml:{xml}")
    rc = s.x(["env", "PYTORCH_NO_CUDA_MEMORY_CACHING=1", cs, "--tool", tool, "--error-exitcode",
              "86", "--print-limit", "20"] + extra +
             [str(binary), "--gtest_brief=0", "--gtest_color=no", f"--gtest_filter={filt}"], env)
    if o.dry_run:
        return True
    s.log.flush()
    text = Path(s.log.name).read_text(errors="replace")
    summaries = re.findall(r"^(?:========= )?((?:ERROR|RACECHECK) SUMMARY.*?)\s*$", text, re.M)
    summary = summaries[-1] if summaries else "no sanitizer summary"
    r = read_gtest_xml(xml)
    ok, s.key = gtest_verdict(rc, r, f"{summary}; ", last_started(text))
    if r.ran is None:  # cut short: what ended before, from the console
        ended = console_results(text)
        passed = sum(1 for st, _ in ended.values() if st == "passed")
        s.key += f"; {len(ended)} tests ended before it ({passed} passed)"
    return ok


def step_memcheck(s: Step) -> bool:
    return sanitizer(s, "memcheck", [])


def step_racecheck(s: Step) -> bool:
    extra = []
    for k in kernel_names(SRC):
        extra += ["--kernel-name", f"kns={k}"]
    return sanitizer(s, "racecheck", extra)


# --- the training runs ---------------------------------------------------------------------------
def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def bench_data(s: Step, binary: Path, cfg: dict) -> Path | None:
    """The bench's synthetic data for cfg's vocabulary (bench/run's recipe and place,
    data/bench-v<V>/, so that the bench step finds it made); GPU_CHECK_DATA_DIR moves it."""
    vocab, seq = cfg["model"]["vocab_size"], cfg["model"]["seq_len"]
    data = Path(os.environ.get("GPU_CHECK_DATA_DIR") or SRC / "data") / f"bench-v{vocab}"
    if (data / "train.h5").is_file() and (data / "valid.h5").is_file():
        s.say(f"# data: {data} (made before)")
        return data
    docs = max(64, 2_000_000 // (seq + 1))  # ~2 M tokens, as bench/run makes them
    if s.run.o.dry_run:
        s.say("  # the data, unless made before (one of the runs, or bench/run):")
    rc = s.x([str(binary), "make-synthetic", "--out", str(data), "--vocab", str(vocab),
              "--programs", "8", "--doc-len", str(seq + 1), "--train-docs", str(docs),
              "--valid-docs", "16"])
    if rc != 0:
        s.key = f"make-synthetic failed (exit {rc})"
        return None
    return data


def train_figures(metrics: Path, warmup: int) -> dict:
    """From a run's metrics.jsonl: its train records' count, first and last loss, the median
    tokens/s after the warm-up, and the peaks (the allocator's peak of allocated bytes, as
    torch.cuda.max_memory_allocated reads it; the process's resident host memory)."""
    try:
        recs = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        recs = []
    train = [r for r in recs if r.get("type") == "train"]
    if not train:
        return {"steps": 0}
    timed = train[warmup:] or train
    return {"steps": len(train), "first_loss": train[0]["loss"], "last_loss": train[-1]["loss"],
            "finite": all(math.isfinite(r["loss"]) for r in train),
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed),
            "gpu_peak_bytes": max(r.get("gpu_mem_peak_bytes", 0) for r in train),
            "host_rss_bytes": max(r.get("host_rss_bytes", 0) for r in train)}


LORA_BASE_RE = re.compile(r"LoRA: base .* in (\w+) \(fingerprint")
OFFLOAD_HOST_RE = re.compile(r"optimizer offload: ([0-9.]+) GiB of host buffers held "
                             r"\(moe-train plan: ([0-9.]+) GiB\)")


def train_verdict(name: str, run: TrainRun, rc: int, plan: dict, fig: dict,
                  log_text: str) -> tuple[bool, str]:
    """(passed, key figure) of a training run: every step ran with a finite loss, and the
    measured device peak is within PLAN_BAR of `moe-train plan`'s peak_bytes; the LoRA run's base
    must be bf16."""
    problems, parts = [], []
    if rc != 0:
        problems.append(f"exit {rc}" + (" (timeout)" if rc in (124, 137) else ""))
    if fig["steps"] < run.steps:
        problems.append(f"{fig['steps']} of {run.steps} steps")
    if fig["steps"]:
        if not fig["finite"]:
            problems.append("a non-finite loss")
        parts.append(f"{fig['steps']} steps, {fig['tokens_per_s']:,.0f} tokens/s, loss "
                     f"{fig['first_loss']:.3f} -> {fig['last_loss']:.3f}")
        planned, measured = plan.get("peak_bytes") or 0, fig["gpu_peak_bytes"]
        if planned and measured:
            err = planned / measured - 1  # as docs/memory.md's tables: + when the plan is above
            parts.append(f"peak {gib(measured)}, plan {gib(planned)} ({err:+.1%})")
            if abs(err) > PLAN_BAR:
                problems.append(f"plan off by {err:+.1%} (bar {PLAN_BAR:.0%})")
        else:
            problems.append("no planned peak" if not planned else "no measured peak")
    if name == "lora-gemma4":  # the 512-wide heads' SDPA kernel, as the trainer logs it
        m = re.search(r"attention: head_dim 512 runs on torch's (.+?) SDPA kernel", log_text)
        parts.append(f"head_dim 512 on {m.group(1) if m else '?'}")
        if not m:
            problems.append("no log line naming the head_dim 512 attention kernel")
    if name == "lora-bf16":
        m = LORA_BASE_RE.search(log_text)
        base = m.group(1) if m else "?"
        parts.append(f"base {base}")
        if base != "BFloat16":
            problems.append(f"the base is {base}, not BFloat16")
    # Offload's host side, informational: the buffers the optimizer holds as the trainer logs them
    # (newer trainers), else the process's resident memory next to the plan's host bytes.
    m = OFFLOAD_HOST_RE.search(log_text)
    if m:
        parts.append(f"host buffers {float(m.group(1)):.1f} GiB, plan {float(m.group(2)):.1f} GiB")
    elif plan.get("host_bytes") and fig["steps"]:
        parts.append(f"host RSS {gib(fig['host_rss_bytes'])}, plan's host {gib(plan['host_bytes'])}")
    key = "; ".join(parts + [f"!! {p}" for p in problems])
    return not problems, key


def step_train_run(s: Step) -> bool:
    """A training run of TRAIN_RUNS with moe-train: its plan (`moe-train plan --json`, kept as
    OUTDIR/<step>/plan.json) and the run (OUTDIR/<step>/metrics.jsonl), compared."""
    o, run = s.run.o, TRAIN_RUNS[s.name]
    binary = o.build / "src" / "moe-train"
    if not o.dry_run and not os.access(binary, os.X_OK):
        s.key = f"no {binary} (build failed or skipped)"
        return False
    config = SRC / run.config
    data = bench_data(s, binary, json.loads(config.read_text()))
    if data is None:
        return False
    out = o.outdir / s.name
    sets = [*run.sets, f"data.train_path={data / 'train.h5'}",
            f"data.valid_path={data / 'valid.h5'}", f"training.output_dir={out}", f"training.train_iters={run.steps}",
            "training.eval_interval=0", "checkpoint.save_final=false", "checkpoint.save_interval=0",
            "training.device=cuda"]
    set_args = [a for v in sets for a in ("--set", v)]
    rc_plan, plan_text = s.capture([str(binary), "plan", "--config", str(config), *set_args,
                                    "--json"])
    rc = s.x([str(binary), "--config", str(config), "--overwrite", *set_args])
    if o.dry_run:
        return True
    try:
        plan = json.loads(plan_text) if rc_plan == 0 else {}
    except ValueError:
        plan = {}
    s.say(f"# plan (exit {rc_plan}): peak {plan.get('peak_bytes')}, reserved "
          f"{plan.get('reserved_bytes')}, host {plan.get('host_bytes')}")
    if out.is_dir():
        (out / "plan.json").write_text(plan_text)
    fig = train_figures(out / "metrics.jsonl", run.warmup)
    s.say(f"# figures: {json.dumps(fig)}")
    ok, s.key = train_verdict(s.name, run, rc, plan, fig, s.log_text())
    return ok


PY_STEPS = {"gpu-tests": step_gpu_tests, "memcheck": step_memcheck, "racecheck": step_racecheck,
            "lora-bf16": step_train_run, "qlora-nf4": step_train_run, "lora-mla": step_train_run,
            "lora-gemma4": step_train_run, "offload-1b": step_train_run}


# --- the run -------------------------------------------------------------------------------------
@dataclass
class Outcome:
    name: str
    status: str  # pass, fail, skip
    secs: str
    key: str


class Runner:
    def __init__(self, o: Options, plan: Plan):
        self.o, self.plan = o, plan
        self.env = dict(os.environ)
        if "GPU_CHECK_PATH" in self.env:  # as scripts/gpu-check was called (see there)
            self.env["PATH"] = os.environ["PATH"] = self.env.pop("GPU_CHECK_PATH")
        self.outcomes: list[Outcome] = []
        self.failed = 0
        self.time_skipped: list[str] = []
        self.t0 = int(time.time())
        self.deadline = self.t0 + plan.budget - SUMMARY_S  # the steps end here

    def plan_budget(self, name: str) -> int:
        return next(secs for n, secs, _ in self.plan.selected if n == name)

    def shell_step(self, s: Step, name: str) -> bool:
        """A step function of scripts/gpu-check in its own bash, with the variables earlier steps
        exported; what it exports is kept for the next steps."""
        with tempfile.TemporaryDirectory(prefix="gpu-check-step.") as tmp:
            env = dict(self.env, GPU_CHECK_OUTDIR=str(self.o.outdir), GPU_CHECK_BUILD=str(self.o.build),
                       GPU_CHECK_DRY_RUN=str(int(self.o.dry_run)),
                       GPU_CHECK_SKIP_BUILD=str(int(self.o.skip_build)),
                       GPU_CHECK_CUDA_ARCH=self.o.cuda_arch, GPU_CHECK_STEP_END=str(int(s.end)),
                       GPU_CHECK_RESULT=f"{tmp}/result", GPU_CHECK_ENV=f"{tmp}/env")
            out = None if self.o.dry_run else s.log
            subprocess.run(["bash", str(SCRIPT), "--step", name], env=env, stdout=out,
                           stderr=subprocess.STDOUT if out else None)
            try:
                rc, skip, key = Path(f"{tmp}/result").read_text().split("\0")[:3]
            except (OSError, ValueError):
                rc, skip, key = "1", "", f"the {name} step ended without a result"
            try:
                exported = Path(f"{tmp}/env").read_bytes().split(b"\0")
                self.env = dict(e.decode(errors="replace").split("=", 1) for e in exported
                                if b"=" in e)
            except OSError:
                pass
        s.skip, s.key = skip, key
        return rc == "0"

    def step(self, name: str, budget: int, runner: str, later: int) -> None:
        start = time.time()
        flexible = name in self.plan.flexible
        if self.o.dry_run:
            if flexible:
                print(f"\n### {name} (gives way: what the steps before leave, {budget}s planned, "
                      f"at least {FLEX_MIN_S}s)")
            else:
                print(f"\n### {name} (budget {budget}s)")
            s = Step(self, name, start + budget, None)
            (self.shell_step(s, name) if runner == "sh" else PY_STEPS[name](s))
            if s.skip:
                print(f"  # -> skip ({s.skip})")
            return
        log_path = self.o.outdir / f"{name}.log"
        left = self.deadline - int(start)  # whole seconds, as the budgets are
        timeout = flexible_timeout(left, later) if flexible else step_timeout(budget, left, later)
        if timeout is None and flexible:  # by design: not counted as a run cut short
            key = f"gave way: {max(left - later, 0)} s left, needs {FLEX_MIN_S} s"
            log_path.write_text(f"[{now_iso()}] skip: {key}\n")
            self.record(Outcome(name, "skip", "0.0", key), log_path)
            return
        if timeout is None:
            key = f"needs {budget} s, {max(left, 0)} s left"
            self.time_skipped.append(name)
            log_path.write_text(f"[{now_iso()}] skip: {key}\n")
            self.record(Outcome(name, "skip", "0.0", key), log_path)
            return
        with open(log_path, "w") as log:
            s = Step(self, name, int(start) + timeout, log)
            planned = f"gives way, {budget}s planned" if flexible else f"budget {budget}s"
            log.write(f"=== {name}: started {now_iso()}, {planned}, timeout {timeout}s\n")
            log.flush()
            try:
                ok = self.shell_step(s, name) if runner == "sh" else PY_STEPS[name](s)
                rc = 0 if ok else 1
            except Exception as e:  # a bug here must not cost the later steps
                s.say(f"!! {type(e).__name__}: {e}")
                ok, rc = False, 1
            secs = f"{time.time() - start:.1f}"
            if s.skip:
                status, key = "skip", s.key or s.skip
            elif ok:
                status, key = "pass", s.key
            else:
                status, key = "fail", s.key or f"exit {rc}"
                self.failed += 1
            log.write(f"=== {name}: {status} (exit {rc}) after {secs}s, ended {now_iso()}\n")
        self.record(Outcome(name, status, secs, key), log_path)

    def record(self, out: Outcome, log_path: Path) -> None:
        self.outcomes.append(out)
        print(f"gpu-check: {out.name:<10} {out.status:<4} {out.secs:>6}s  {out.key}", flush=True)
        if out.status == "fail":
            for line in log_path.read_text(errors="replace").splitlines()[-15:]:
                print("    | " + line)

    def run_steps(self) -> None:
        sel = self.plan.selected
        for i, (name, budget, runner) in enumerate(sel):
            later = sum(b for _, b, _ in sel[i + 1:])
            self.step(name, budget, runner, later)
        for name in self.plan.off:  # listed, so that the summary says it was not asked for
            if self.o.dry_run:
                print(f"\n### {name}\n  # -> off (opt-in: --full-ctest)")
                continue
            self.outcomes.append(Outcome(name, "skip", "0.0", "off (opt-in: --full-ctest)"))


# --- dry run: the budgets and the command for the GPU machine ------------------------------------
def staged_problem(debs: Path) -> str:
    """The staged .debs are exactly those SHA256SUMS names; "" when so, else the first problem."""
    named = sorted(re.sub(r"^[0-9a-fA-F]{64} [ *]", "", line)
                   for line in (debs / "SHA256SUMS").read_text().splitlines() if line)
    present = sorted(p.name for p in debs.glob("*.deb"))
    missing = [n for n in named if n not in present]
    extra = [n for n in present if n not in named]
    if missing:
        return f"{len(missing)} .deb named in SHA256SUMS missing: {' '.join(missing[:3])}"
    if extra:
        return f"{len(extra)} .deb not named in SHA256SUMS: {' '.join(extra[:3])}"
    return ""


def budget_table(o: Options, p: Plan) -> None:
    planned = {n: secs for n, secs, _ in p.selected}
    table = step_budgets()
    est, _ = gpu_tests_estimate(gpu_test_suites(SRC))
    notes = {"gpu-tests": f"moe_gpu_tests: estimated {est:.0f} s (below) + {MAX_CRASH_RERUNS} "
                          f"reruns' start-up {MAX_CRASH_RERUNS * RERUN_START_S:.0f} s",
             "bench": f"gives way: what the steps before leave unused (at least {FLEX_MIN_S} s)"}
    for name, run in TRAIN_RUNS.items():
        notes[name] = f"{run.steps} steps, {run.what}, {run.config}: peak memory vs the plan"
    print(f"\n{'step':<12} {'budget':>7}")
    for name, _, _ in STEP_TABLE:
        if name in p.off:
            print(f"{name:<12} {'-':>5}     off (opt-in: --full-ctest; {table[name]} s)")
        elif name not in planned:
            print(f"{name:<12} {'-':>5}     not in --only")
        else:
            note = f"   {notes[name]}" if name in notes else ""
            print(f"{name:<12} {planned[name]:>5} s{note}")
    print(f"{'summary':<12} {SUMMARY_S:>5} s   summary.md, --pack")
    over = (f"total <= {PLAN_S // 60} min" if p.total_s <= PLAN_S
            else f"total > {PLAN_S // 60} min ({p.total_s // 60} min {p.total_s % 60} s)")
    print(f"{'total':<12} {p.total_s:>5} s   {over}")
    if p.budget_given:
        print(f"--budget {p.budget}: the run ends within {p.budget} s; steps that no longer fit are "
              "skipped, the last ones first")
    print("A step's timeout is its budget plus what earlier steps left unused, as long as the later steps")
    print("keep their full budgets; a step that cannot get its full budget is skipped and reported.")
    # The same run there: OUTDIR under the returned folder, --pack (at most 8 files come back), and
    # a budget that ends before the command's own limit, so that summary.md is always written.
    dev_budget = min(p.budget, DEVICE_MAX_S - DEVICE_MARGIN_S)
    dev_cmd = 'scripts/gpu-check "$OUT/gpu-check" --pack'
    if o.pass_args:
        dev_cmd += " " + quote(o.pass_args)
    if dev_budget != p.total_s:
        dev_cmd += f" --budget {dev_budget}"
    debs = SRC / ".gpu-deps" / "debs"
    carry = ".gpu-deps/debs" if (debs / "SHA256SUMS").is_file() else "nothing"
    print(f"\ndevice command: {dev_cmd}    carry: {carry}    timeout_s: {dev_budget + DEVICE_MARGIN_S}")
    print(f"  (timeout_s = the {dev_budget} s budget + {DEVICE_MARGIN_S} s for start-up and unpacking;"
          f" one command may run {DEVICE_MAX_S} s at most)")
    if carry == "nothing":
        print(f"  !! no staged .debs in {debs}: run scripts/stage-gpu-deps first (the GPU machine has "
              "no package registry)")
    else:
        n = len((debs / "SHA256SUMS").read_text().splitlines())
        size = sum(f.stat().st_size for f in debs.rglob("*") if f.is_file())
        print(f"  .gpu-deps/debs: {n} .debs, {size / 1048576:.1f} MiB (with the working tree: 64 MiB at most)")
        problem = staged_problem(debs)
        if problem:
            print(f"  !! {problem}: restage (scripts/stage-gpu-deps; scripts/stage-gpu-deps --check)")
    if dev_budget < p.budget:
        print(f"  !! {p.budget} s do not fit one command: it runs with --budget {dev_budget}; the last "
              "steps that no longer fit are skipped")
    if dev_budget < p.total_s and "full-ctest" in planned:
        last = p.selected[-1][1]
        print(f"  !! full-ctest ({last} s) runs only if the steps before it finish within "
              f"{dev_budget - SUMMARY_S - last} s")
        print("     (e.g. an incremental build); otherwise it is skipped and reported")


# --- summary and packing -------------------------------------------------------------------------
def pack_outdir(outdir: Path) -> tuple[bool, str]:
    """Everything in OUTDIR except summary.md into OUTDIR/logs.tar.gz (step logs, bench/, gtest
    XML), written beside it first so that a failed tar leaves the files as they were."""
    skip = {"summary.md", "logs.tar.gz", ".logs.tar.gz.part"}
    entries = sorted(e.name for e in outdir.iterdir() if e.name not in skip)
    if not entries:
        return True, "nothing to pack"
    part = outdir / ".logs.tar.gz.part"
    try:
        with tarfile.open(part, "w:gz") as tar:
            for e in entries:
                tar.add(outdir / e, arcname=e)
        part.replace(outdir / "logs.tar.gz")
    except OSError as e:
        part.unlink(missing_ok=True)
        return False, f"packing failed ({e}): the logs stay as they are"
    for e in entries:
        path = outdir / e
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    size = (outdir / "logs.tar.gz").stat().st_size
    return True, f"{len(entries)} entries packed into logs.tar.gz ({size / 1024:.0f}K)"


def count_files(outdir: Path) -> int:
    """Files in OUTDIR once summary.md is written."""
    return sum(1 for f in outdir.rglob("*") if f.is_file() and f != outdir / "summary.md") + 1


def files_line(n: int, pack: bool) -> tuple[str, bool]:
    """With --pack, more than MAX_FILES is a failure (the rest would not come back)."""
    if n <= MAX_FILES:
        return f"{n} files in OUTDIR: <= {MAX_FILES}, all come back", True
    if pack:
        return f"**{n} files in OUTDIR: more than {MAX_FILES}, not all come back**", False
    return f"{n} files in OUTDIR: more than {MAX_FILES} (--pack makes them 2)", True


def render_summary(outcomes: list[Outcome], header: str, failed: int, time_skipped: list[str],
                   footer: str) -> str:
    overall = "PASS"
    if failed:
        overall = f"FAIL ({failed} failed)"
    elif time_skipped:
        overall = f"INCOMPLETE (skipped for want of time: {' '.join(time_skipped)})"
    lines = [f"## gpu-check {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ}", "",
             f"{header}: **{overall}**", "", "| step | status | seconds | key figure |",
             "| --- | --- | ---: | --- |"]
    for o in outcomes:
        lines.append(f"| {o.name} | {o.status} | {o.secs} | {o.key.replace('|', chr(92) + '|')} |")
    return "\n".join(lines + ["", footer]) + "\n"


def commit_of(src: Path) -> str:
    def git(*a):
        return subprocess.run(["git", "-C", str(src), *a], capture_output=True, text=True)
    head = git("rev-parse", "--short=12", "HEAD")
    commit = head.stdout.strip() if head.returncode == 0 else "unknown"
    modified = git("diff", "--quiet", "HEAD").returncode != 0
    return commit + (" (modified)" if modified else "")


def main(argv: list[str]) -> int:
    try:
        o = parse_args(argv)
        plan = make_plan(o)
    except UsageError as e:
        print(f"gpu-check: {e}", file=sys.stderr)
        return 2
    run = Runner(o, plan)
    if o.dry_run:
        print(f"gpu-check --dry-run: source {SRC}, build {o.build}, out {o.outdir}, budget "
              f"{plan.budget}s, CUDA arch {o.cuda_arch}")
        print("(nothing is run or written; commands appear as the steps would run them)")
        budget_table(o, plan)
    else:
        o.outdir.mkdir(parents=True, exist_ok=True)
        until = time.strftime("%H:%M:%S", time.localtime(run.t0 + plan.budget))
        print(f"gpu-check: source {SRC}, build {o.build}, out {o.outdir}, budget {plan.budget}s "
              f"(until {until})", flush=True)
    run.run_steps()
    if o.dry_run:
        packed = ", packed into logs.tar.gz" if o.pack else ""
        print(f"\ndry run: nothing was run; the real run writes {o.outdir}/<step>.log and "
              f"{o.outdir}/summary.md{packed}")
        return 0
    note = ""
    if o.pack:
        _, note = pack_outdir(o.outdir)
    line, files_ok = files_line(count_files(o.outdir), o.pack)
    failed = run.failed + (0 if files_ok else 1)
    gpu = run.env.get("GPU_CHECK_GPU_NAME") or "unknown"
    header = (f"host {socket.gethostname()}, GPU {gpu}, commit {commit_of(SRC)}, "
              f"{int(time.time()) - run.t0}s of {plan.budget}s")
    summary = render_summary(run.outcomes, header, failed, run.time_skipped,
                             (note + "; " if note else "") + line)
    (o.outdir / "summary.md").write_text(summary)
    print("\n" + summary, end="")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
