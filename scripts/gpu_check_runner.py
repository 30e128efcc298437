#!/usr/bin/env python3
"""The runner of scripts/gpu-check: options, step budgets, the GPU test steps with verdicts from
gtest XML and reruns after a crash, the summary and the packing. The steps that shape the machine
(env, deps, configure, build) and the two plain commands (bench, full-ctest) stay shell functions
in scripts/gpu-check; this program calls them one at a time (`scripts/gpu-check --step NAME`) and
carries their exported variables to the next step. Standard library only: the GPU machine has a
bare python3. Usage: the comment at the top of scripts/gpu-check (`scripts/gpu-check --help`).
"""
from __future__ import annotations

import datetime
import os
import re
import shlex
import shutil
import socket
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
# steps' budgets plus SUMMARY_S make 480 s, so that one run stays under 8 minutes of the GPU
# machine's time; full-ctest is opt-in, not counted.
STEP_TABLE = [("env", 15, "sh"), ("deps", 25, "sh"), ("configure", 45, "sh"), ("build", 180, "sh"),
              ("gpu-tests", 75, "py"), ("memcheck", 30, "py"), ("racecheck", 30, "py"),
              ("bench", 75, "sh"), ("full-ctest", 300, "sh")]
SUMMARY_S = 5         # summary.md and --pack, after the last step
DEVICE_MAX_S = 600    # the longest one command may run on the GPU machine
DEVICE_MARGIN_S = 60  # its timeout beyond our budget: start-up, and the files' way back
MAX_FILES = 8         # the GPU machine sends back at most this many files of OUTDIR
# Small shapes only, none of which skips on a device: edge cases (1 token, 1 expert), a k > 1 case
# per dtype family, the row kernels' packed (unrolled k = 8) and per-element (two chunks) shapes,
# the dispatch plan small and at T 4096 / E 256, the router with softmax and with sigmoid scores,
# the poison test, the rotary kernel on a strided view with documents, and the SwiGLU kernel's
# packed form (rows of [gate | up]) with 16-byte packs and with one element per thread. gtest's
# '*' also matches '/' and '.'.
SAN_FILTER = ("Grid/PermuteGpu.*/fp32_T7_E8_k2:Grid/PermuteGpu.*/bf16_T7_E64_k8:"
              "Shapes/PermuteGpu.*/bf16_T33_E16_k8_d1000:Shapes/PermuteGpu.*/fp16_T33_E16_k10_d3:"
              "Grid/PermuteGpu.*/fp16_T1_E1_k1:PlanGrid/DispatchPlanGpu.*/T7_E8_k2:"
              "PlanGrid/DispatchPlanGpu.*/T4096_E256_k8:Grid/RouterGpu.*/fp32_T7_E8_k2:"
              "Grid/RouterGpu.*/fp32_T7_E64_k8_sigmoid:PermuteGpuPoison.*:"
              "Grid/RotaryGpu.*/bf16_B2_N3_S5_hd6_view_docs:"
              "Grid/SwigluGpu.*/bf16_33x1024_packed:Grid/SwigluGpu.*/fp32_3x5_packed")
MAX_CRASH_RERUNS = 3


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
    selected: list[tuple[str, int, str]]  # (name, budget, runner)
    off: list[str]                        # full-ctest when not asked for
    steps_s: int
    total_s: int
    budget: int
    budget_given: bool


def make_plan(o: Options) -> Plan:
    selected, off = [], []
    for name, secs, runner in STEP_TABLE:
        if o.only and name not in o.only:
            continue
        if name == "full-ctest" and not o.full_ctest:
            off.append(name)
            continue
        selected.append((name, secs, runner))
    steps_s = sum(s for _, s, _ in selected)
    total = steps_s + SUMMARY_S
    budget = o.budget if o.budget is not None else total
    if budget <= SUMMARY_S:
        raise UsageError(f"--budget must exceed the summary's {SUMMARY_S}s")
    return Plan(selected, off, steps_s, total, budget, o.budget is not None)


def step_timeout(budget: int, left: int, later: int) -> int | None:
    """A step's timeout: its budget plus what earlier steps left unused, as long as the later steps
    keep their full budgets; None when it cannot get its full budget (skipped, never started short:
    it would fail for want of time and say nothing about the code)."""
    if left < budget:
        return None
    return max(budget, left - later)


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

    def x(self, args: list[str], env: dict | None = None) -> int:
        """Runs args under the step's remaining time, echoing it first (TERM 3 s before the end,
        KILL at it); in a dry run prints it. Returns the exit status, 124 on a timeout and
        128 + N for a signal, as the shell reports them."""
        if self.run.o.dry_run:
            print("  " + quote(args))
            return 0
        left = int(self.end - time.time())
        if left <= 0:
            self.say(f"!! [{time.strftime('%H:%M:%S')}] no time left for: {quote(args)}")
            return 124
        self.say(f"+ [{time.strftime('%H:%M:%S')}] {quote(args)}   (timeout {left}s)")
        cmd = ["timeout", "-k", "3", str(left - 3 if left > 4 else 1)] + args
        rc = subprocess.run(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                            env=env or self.run.env).returncode
        rc = 128 - rc if rc < 0 else rc
        if rc in (124, 137):
            self.say(f"!! timed out after {left}s")
        return rc


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


def step_gpu_tests(s: Step) -> bool:
    """moe_gpu_tests (tests/kernels/*, tests/moe/experts_gpu_test.cpp,
    tests/train/cuda_graph_gpu_test.cpp) in one process: ctest would start one per test case, each
    loading LibTorch and creating a CUDA context (seconds each, hundreds of cases). A test that
    kills the process (a signal: exit 129-255 but not 137, the step's own KILL) would hide every
    test after it (2026-11-30: one SIGSEGV hid 360 of 368): it is named, and the rest run again
    without its suite, at most three times."""
    o = s.run.o
    binary = tests_bin(o)
    if not o.dry_run and not os.access(binary, os.X_OK):
        s.key = f"no {binary} (build failed or skipped)"
        return False
    base = [str(binary), "--gtest_brief=0", "--gtest_color=no"]
    xml = o.outdir / "gpu-tests.xml"
    rc = s.x(base + [f"--gtest_output=xml:{xml}"])
    if o.dry_run:
        return True
    crashed: list[str] = []
    excluded: list[str] = []
    while rc > 128 and rc != 137 and len(crashed) < MAX_CRASH_RERUNS:
        s.log.flush()
        name = last_started(Path(s.log.name).read_text(errors="replace"))
        if not name:
            break
        crashed.append(f"{name} (exit {rc})")
        suite = name.split(".")[0]
        excluded.append(f"{suite}.*")
        s.say(f"# {name} killed the process (exit {rc}): the rest again, without {suite}.*")
        xml = o.outdir / f"gpu-tests-{len(crashed) + 1}.xml"
        rc = s.x(base + ["--gtest_filter=-" + ":".join(excluded), f"--gtest_output=xml:{xml}"])
    s.log.flush()
    prefix = f"crashed: {', '.join(crashed)}; then " if crashed else ""
    ok, s.key = gtest_verdict(rc, read_gtest_xml(xml), prefix,
                              last_started(Path(s.log.name).read_text(errors="replace")))
    return ok and not crashed


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
    ok, s.key = gtest_verdict(rc, read_gtest_xml(xml), f"{summary}; ", last_started(text))
    return ok


def step_memcheck(s: Step) -> bool:
    return sanitizer(s, "memcheck", [])


def step_racecheck(s: Step) -> bool:
    extra = []
    for k in kernel_names(SRC):
        extra += ["--kernel-name", f"kns={k}"]
    return sanitizer(s, "racecheck", extra)


PY_STEPS = {"gpu-tests": step_gpu_tests, "memcheck": step_memcheck, "racecheck": step_racecheck}


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
        if self.o.dry_run:
            print(f"\n### {name} (budget {budget}s)")
            s = Step(self, name, start + budget, None)
            (self.shell_step(s, name) if runner == "sh" else PY_STEPS[name](s))
            if s.skip:
                print(f"  # -> skip ({s.skip})")
            return
        log_path = self.o.outdir / f"{name}.log"
        left = self.deadline - int(start)  # whole seconds, as the budgets are
        timeout = step_timeout(budget, left, later)
        if timeout is None:
            key = f"needs {budget} s, {max(left, 0)} s left"
            self.time_skipped.append(name)
            log_path.write_text(f"[{now_iso()}] skip: {key}\n")
            self.record(Outcome(name, "skip", "0.0", key), log_path)
            return
        with open(log_path, "w") as log:
            s = Step(self, name, int(start) + timeout, log)
            log.write(f"=== {name}: started {now_iso()}, budget {budget}s, timeout {timeout}s\n")
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
    sel_names = [n for n, _, _ in p.selected]
    print(f"\n{'step':<12} {'budget':>7}")
    for name, secs, _ in STEP_TABLE:
        why = ""
        if name in p.off:
            why = f"off (opt-in: --full-ctest; {secs} s)"
        elif name not in sel_names:
            why = "not in --only"
        print(f"{name:<12} {'-':>5}     {why}" if why else f"{name:<12} {secs:>5} s")
    print(f"{'summary':<12} {SUMMARY_S:>5} s   summary.md, --pack")
    over = ("total <= 8 min" if p.total_s <= 480
            else f"total > 8 min ({p.total_s // 60} min {p.total_s % 60} s)")
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
    if dev_budget < p.total_s and "full-ctest" in sel_names:
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
