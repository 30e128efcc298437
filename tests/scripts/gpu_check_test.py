#!/usr/bin/env python3
"""scripts/gpu-check's runner (scripts/gpu_check_runner.py) on the CPU: verdicts from gtest XML and
console logs recorded from our own test binaries (tests/scripts/recorded/: a run with no device,
a failing run, a run whose suite set-up failed, a run killed by SIGSEGV, a test list with
parameterised suites); the plan (every current GPU suite has an estimate, and the default steps
with the training runs fit 515 s, 575 s as the GPU machine's command); then whole runs of the
command with stand-in programs: a moe_gpu_tests that crashes in test k of n (only k+1..n run
again), hangs (ended at the step's end, or after the stall limit with the rest run again) or
fails, a compute-sanitizer, a moe-train for the training runs (peak memory against the plan), a
budget too small for a step, bench giving way, the shell steps' variables carried from one step to
the next, the summary and the packing.

usage: gpu_check_test.py (no arguments; run from anywhere)
"""
import importlib.util
import json
import os
import re
import stat
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORDED = Path(__file__).resolve().parent / "recorded"
spec = importlib.util.spec_from_file_location("gpu_check_runner",
                                              ROOT / "scripts" / "gpu_check_runner.py")
runner = importlib.util.module_from_spec(spec)
sys.modules["gpu_check_runner"] = runner  # dataclasses look their module up there
spec.loader.exec_module(runner)

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


# --- verdicts on recorded logs -------------------------------------------------------------------
def recorded_verdicts():
    r = runner.read_gtest_xml(RECORDED / "unit-passed.xml")
    ok, key = runner.gtest_verdict(0, r, "")
    check(ok and key == f"{r.ran} passed, 0 failed, 0 skipped of {r.ran}" and r.ran >= 5,
          f"passing run: {key}")

    r = runner.read_gtest_xml(RECORDED / "unit-failed.xml")
    ok, key = runner.gtest_verdict(1, r, "")
    check(not ok and r.failed == 1 and
          key.endswith("; failed: DeepSpeedKeys.DocsTableListsEveryKeyWithItsStatus"),
          f"failing run names the test: {key}")

    # moe_gpu_tests on a machine without a device: every case skips, which fails the step.
    r = runner.read_gtest_xml(RECORDED / "gpu-tests-no-device.xml")
    ok, key = runner.gtest_verdict(0, r, "")
    check(not ok and r.skipped == r.ran > 0 and r.passed == 0 and
          "skipped (no device, or no kernels built?): ExpertsGpu.GroupedGemmMatchesOracle" in key,
          f"no device: {key}")

    # A failed SetUpTestSuite: googletest records the suite's cases as skipped, exit 1.
    r = runner.read_gtest_xml(RECORDED / "cli-failed.xml")
    ok, key = runner.gtest_verdict(1, r, "")
    check(not ok and r.skipped == 2 and r.failed == 0, f"suite set-up failure: {key}")

    # Killed by SIGSEGV mid-test: no XML; the console log names the test it was in.
    log = (RECORDED / "cli-crashed.log").read_text()
    started = runner.last_started(log)
    r = runner.read_gtest_xml(RECORDED / "cli-crashed.xml")
    ok, key = runner.gtest_verdict(139, r, "", started)
    check(not ok and r.ran is None and
          key == "no gtest summary (exit 139); last test started: CliTest.NegativeLearningRate",
          f"crash: {key}")
    ok, key = runner.gtest_verdict(124, r, "", started)
    check(key.startswith("no gtest summary (exit 124, timeout)"), f"timeout: {key}")

    # An empty selection (a renamed test under a sanitizer filter) must not pass.
    empty = runner.GtestResult(ran=0)
    ok, key = runner.gtest_verdict(0, empty, "ERROR SUMMARY: 0 errors; ")
    check(not ok and key.endswith("(no test selected)"), f"nothing selected: {key}")


def console_verdicts():
    # The console's per-test lines give what the XML gives, and survive a crash.
    log = (RECORDED / "gpu-tests-no-device.log").read_text()
    res = runner.console_results(log)
    r = runner.read_gtest_xml(RECORDED / "gpu-tests-no-device.xml")
    check(len(res) == r.ran == 14 and all(s == "skipped" for s, _ in res.values()),
          f"console results of the no-device run match its XML: {len(res)} of {r.ran}")
    res = runner.console_results((RECORDED / "unit-failed.log").read_text())
    failed = [n for n, (s, _) in res.items() if s == "failed"]
    check(failed == ["DeepSpeedKeys.DocsTableListsEveryKeyWithItsStatus"],
          f"a failure is counted once (the end-of-run listing has no time): {failed}")
    log = (RECORDED / "cli-crashed.log").read_text()
    check(runner.unfinished_test(log) == "CliTest.NegativeLearningRate" and
          len(runner.console_results(log)) == 4, "a crash: the test it was in, and the 4 before it")
    check(runner.unfinished_test((RECORDED / "unit-passed.log").read_text()) == "",
          "a finished run has no unfinished test")
    param = ("[  FAILED  ] Grid/RouterGpu.ForwardBackwardMatchReference/fp32_T7_E8_k2, where "
             "GetParam() = 40-byte object <01-00 (3 ms)> (17 ms)")
    check(runner.console_results(param) ==
          {"Grid/RouterGpu.ForwardBackwardMatchReference/fp32_T7_E8_k2": ("failed", 17)},
          "a failed parameterised test's line")

    names = runner.parse_test_list((RECORDED / "torch-tests-list.txt").read_text())
    check(len(names) == 17 and names[0] == "ActivationCheckpointing.SameLossAndGradients" and
          "BucketSizes/OffloadBuckets.BitwiseEqualToOnDeviceUpdate/2" in names and
          names[-1] == "Layouts/OffloadHostBytes.PlannedEqualsAllocated/lora_streamed",
          f"--gtest_list_tests parsed, parameterised names whole: {len(names)}, {names[-1:]}")

    # The step's verdict from the tests' results.
    listed = ["A.a", "A.b", "B.c"]
    ok, key = runner.gpu_tests_verdict(listed, {n: ("passed", 1) for n in listed}, [], 0, True, 1)
    check(ok and key == "3 passed, 0 failed, 0 skipped of 3", f"all passed: {key}")
    ok, key = runner.gpu_tests_verdict(listed, {n: ("passed", 1) for n in listed}, [], 139, True, 1)
    check(not ok and key.endswith("; exit 139"), f"a crash after the last test: {key}")
    ok, key = runner.gpu_tests_verdict(listed, {"A.a": ("passed", 1)},
                                       [runner.Broken("A.b", "hung", "cut at the step's end")],
                                       124, False, 1)
    check(not ok and key == "1 passed, 0 failed, 0 skipped of 3; hung: A.b (cut at the step's end); "
          "not run: 1 (no time left), from B.c", f"a hang at the step's end: {key}")


def plan_and_budgets():
    check(runner.step_timeout(75, 400, 100) == 300, "a step gets what the later steps leave")
    check(runner.step_timeout(75, 100, 100) == 75, "never less than its budget")
    check(runner.step_timeout(75, 74, 0) is None, "skipped when its budget no longer fits")
    check(runner.flexible_timeout(100, 40) == 60 and runner.flexible_timeout(60, 40) is None,
          "the step that gives way gets what is left, and is skipped under 30 s")
    check(runner.quote(["a", "b c", "it's", "--x=1;2"]) == "a 'b c' 'it'\\''s' '--x=1;2'",
          "commands quoted as the shell functions quote them")
    line, ok = runner.files_line(9, True)
    check(not ok and "more than 8, not all come back" in line, "with --pack, 9 files fail")
    line, ok = runner.files_line(9, False)
    check(ok and "--pack makes them 2" in line, "without --pack, 9 files are a note")

    # The default plan: every step, the two training runs and the summary in 480 s; bench gives
    # way (what is left); the GPU machine's command within 9 minutes.
    o = runner.Options()
    plan = runner.make_plan(o)
    names = [n for n, _, _ in plan.selected]
    fixed = sum(s for n, s, _ in plan.selected if n != "bench")
    bench = dict((n, s) for n, s, _ in plan.selected)["bench"]
    check(plan.total_s == runner.PLAN_S == 515 and bench == 515 - 5 - fixed >= 0 and
          plan.flexible == ["bench"], f"the default plan is 515 s, bench gets {bench} s")
    check({"gpu-tests", "memcheck", "racecheck", "lora-bf16", "offload-1b"} <= set(names) and
          names.index("bench") == len(names) - 1 and "full-ctest" in plan.off,
          f"the default steps, bench last: {names}")
    check(min(plan.budget, runner.DEVICE_MAX_S - runner.DEVICE_MARGIN_S) +
          runner.DEVICE_MARGIN_S <= 575, "the GPU machine's command: 575 s at most")

    # Every GPU suite there is now has an estimate, with its number of cases where the sources
    # tell (TEST and TEST_F suites); their sum and the reruns' start-up fit gpu-tests' budget.
    suites = runner.gpu_test_suites(ROOT)
    est, unknown = runner.gpu_tests_estimate(suites)
    budget = dict((n, s) for n, s, _ in plan.selected)["gpu-tests"]
    check(len(suites) >= 25 and not unknown,
          f"every suite of moe_gpu_tests has an estimate in GPU_SUITES (missing: {unknown})")
    stale = [f"{s}: {n} in the sources, {runner.GPU_SUITES[s][0]} estimated" for s, n in
             suites.items() if n and s in runner.GPU_SUITES and runner.GPU_SUITES[s][0] != n]
    check(not stale, f"the estimates count the sources' tests: {stale}")
    gone = [s for s in runner.GPU_SUITES if s not in suites]
    check(not gone, f"no estimate for a suite that is gone: {gone}")
    need = est + runner.MAX_CRASH_RERUNS * runner.RERUN_START_S
    check(need <= budget, f"gpu-tests: {est:.0f} s estimated + reruns = {need:.0f} s <= {budget} s")
    # Every kernel family has a case under the sanitizers.
    families = ["PermuteGpu", "DispatchPlanGpu", "RouterGpu", "RotaryGpu", "SwigluGpu", "Adam8bitGpu",
                "Dequant4bitGpu", "ClampedSwigluGpu", "DequantMxfp4Gpu"]
    check(all(f + ".*" in runner.SAN_FILTER for f in families), "the sanitizers cover every kernel")

    os.environ["GPU_CHECK_STEP_BUDGETS"] = "gpu-tests=7,bench=40"
    try:
        b = dict((n, s) for n, s, _ in runner.make_plan(o).selected)
        check(b["gpu-tests"] == 7 and b["bench"] == 40, "GPU_CHECK_STEP_BUDGETS overrides budgets")
        os.environ["GPU_CHECK_STEP_BUDGETS"] = "gpu-test=7"
        try:
            runner.make_plan(o)
            check(False, "a bad GPU_CHECK_STEP_BUDGETS is refused")
        except runner.UsageError as e:
            check("gpu-test=7" in str(e), f"a bad GPU_CHECK_STEP_BUDGETS is refused: {e}")
    finally:
        del os.environ["GPU_CHECK_STEP_BUDGETS"]


def training_verdicts():
    run = runner.TRAIN_RUNS["lora-bf16"]
    fig = {"steps": 30, "first_loss": 10.4, "last_loss": 9.9, "finite": True,
           "tokens_per_s": 60000.0, "gpu_peak_bytes": 10 * 2**30, "host_rss_bytes": 0}
    log = "[t] info LoRA: base randomly initialised in BFloat16 (fingerprint 1); 8 adapter\n"
    ok, key = runner.train_verdict("lora-bf16", run, 0, {"peak_bytes": 10.2 * 2**30}, fig, log)
    check(ok and key == "30 steps, 60,000 tokens/s, loss 10.400 -> 9.900; peak 10.0 GiB, plan "
          "10.2 GiB (+2.0%); base BFloat16", f"a LoRA run within the plan: {key}")
    ok, key = runner.train_verdict("lora-bf16", run, 0, {"peak_bytes": 8 * 2**30}, fig,
                                   log.replace("BFloat16", "Float"))
    check(not ok and "!! plan off by -20.0% (bar 15%)" in key and "!! the base is Float" in key,
          f"a plan 20% low and an fp32 base fail: {key}")
    ok, key = runner.train_verdict("offload-1b", runner.TRAIN_RUNS["offload-1b"], 137, {},
                                   {"steps": 0}, "")
    check(not ok and key == "!! exit 137 (timeout); !! 0 of 8 steps", f"a run cut short: {key}")
    fig = dict(fig, steps=8, host_rss_bytes=20 * 2**30)
    ok, key = runner.train_verdict("offload-1b", runner.TRAIN_RUNS["offload-1b"], 0,
                                   {"peak_bytes": 10 * 2**30, "host_bytes": 17 * 2**30}, fig, "")
    check(ok and key.endswith("(+0.0%); host RSS 20.0 GiB, plan's host 17.0 GiB"),
          f"a trainer that does not log its host buffers: the resident memory instead: {key}")


# --- whole runs with stand-in programs -----------------------------------------------------------
FAKE_GTEST = r"""#!/usr/bin/env python3
# A stand-in for moe_gpu_tests: googletest's console lines, flushed as each test starts and ends,
# --gtest_list_tests, --gtest_filter (positive and negative patterns) and the XML at the end, for
# FAKE_TESTS; a test in FAKE_CRASH kills the process with SIGSEGV, one in FAKE_HANG sleeps, one
# in FAKE_FAIL fails. Each call's filter (or LIST) is appended to FAKE_CALLS.
import fnmatch, os, signal, sys, time
env = lambda k: [t for t in os.environ.get(k, "").split(",") if t]
tests, crash, hang, fail = env("FAKE_TESTS"), env("FAKE_CRASH"), env("FAKE_HANG"), env("FAKE_FAIL")
xml, flt, listing = os.environ.get("GTEST_OUTPUT", "")[4:], os.environ.get("GTEST_FILTER", "*"), False
for a in sys.argv[1:]:
    if a.startswith("--gtest_output=xml:"):
        xml = a[len("--gtest_output=xml:"):]
    elif a.startswith("--gtest_filter="):
        flt = a[len("--gtest_filter="):]
    elif a == "--gtest_list_tests":
        listing = True
pos, _, neg = flt.partition("-")
match = lambda t, pats: any(fnmatch.fnmatchcase(t, p) for p in pats.split(":") if p)
run = [t for t in tests if match(t, pos or "*") and not match(t, neg)]
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write(("LIST" if listing else flt) + "\n")
print("Running main() from ./googletest/src/gtest_main.cc")
if listing:
    suite = ""
    for t in run:
        s, n = t.split(".", 1)
        if s != suite:
            print(s + ".")
            suite = s
        print("  " + n + ("  # GetParam() = 4" if "/" in n else ""))
    sys.exit(0)
print(f"[==========] Running {len(run)} tests", flush=True)
failed = []
for t in run:
    print(f"[ RUN      ] {t}", flush=True)
    if t in crash:
        os.kill(os.getpid(), signal.SIGSEGV)
    if t in hang:
        time.sleep(600)
    if t in fail:
        failed.append(t)
        where = ", where GetParam() = 4" if "/" in t else ""
        print(f"fake.cpp:1: Failure\n[  FAILED  ] {t}{where} (2 ms)", flush=True)
    else:
        print(f"[       OK ] {t} (1 ms)", flush=True)
cases = "".join(f'<testcase name="{t.split(".", 1)[1]}" status="run" result="completed" '
                f'classname="{t.split(".")[0]}">' + ("<failure/>" if t in failed else "") +
                "</testcase>" for t in run)
with open(xml, "w") as f:
    f.write(f'<?xml version="1.0"?><testsuites tests="{len(run)}"><testsuite>{cases}'
            '</testsuite></testsuites>')
print(f"[  PASSED  ] {len(run) - len(failed)} tests.")
if failed:
    print(f"[  FAILED  ] {len(failed)} tests, listed below:")
    for t in failed:
        print(f"[  FAILED  ] {t}")
sys.exit(1 if failed else 0)
"""

FAKE_SANITIZER = r"""#!/bin/sh
# A stand-in for compute-sanitizer: runs the program after its options, then its summary line.
while [ $# -gt 0 ]; do
  case "$1" in
    --tool | --error-exitcode | --print-limit | --kernel-name) shift 2 ;;
    *) break ;;
  esac
done
"$@"; rc=$?
echo "========= ERROR SUMMARY: 0 errors"
exit $rc
"""

FAKE_MOE_TRAIN = r"""#!/usr/bin/env python3
# A stand-in for moe-train: make-synthetic writes train.h5 and valid.h5; plan --json prints a plan
# (peak 10 GiB; 17 GiB of host with the optimizer offloaded); a training run writes metrics.jsonl
# (FAKE_RUN_STEPS steps, peak FAKE_PEAK_GIB) and the log lines gpu-check reads. Calls go to FAKE_CALLS.
import json, os, sys
a = sys.argv[1:]
sets = dict(a[i + 1].split("=", 1) for i in range(len(a) - 1) if a[i] == "--set")
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write("moe-train " + a[0] + "\n")
if a[0] == "make-synthetic":
    out = a[a.index("--out") + 1]
    os.makedirs(out)
    for n in ("train.h5", "valid.h5"):
        open(os.path.join(out, n), "w").close()
    sys.exit(0)
offload = sets.get("zero_optimization.offload_optimizer.device") == "cpu"
if a[0] == "plan":
    print(json.dumps({"peak_bytes": 10 * 2**30, "reserved_bytes": 11 * 2**30,
                      "host_bytes": 17 * 2**30 if offload else 0}, indent=2))
    sys.exit(0)
assert os.path.exists(sets["data.train_path"]), "no data"
out = sets["training.output_dir"]
os.makedirs(out, exist_ok=True)
steps = int(os.environ.get("FAKE_RUN_STEPS") or sets["training.train_iters"])
peak = float(os.environ.get("FAKE_PEAK_GIB", "9.8")) * 2**30
with open(os.path.join(out, "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"type": "eval", "step": 0, "loss": 10.5}) + "\n")
    for s in range(1, steps + 1):
        f.write(json.dumps({"type": "train", "step": s, "loss": 10.4 - 0.01 * s,
                            "tokens_per_s": 50000.0 if s > 2 else 1000.0,
                            "gpu_mem_peak_bytes": peak * min(1.0, s / 2),
                            "host_rss_bytes": 2**30}) + "\n")
if "lora.r" in sets:
    print("[t] info LoRA: base randomly initialised in BFloat16 (fingerprint 1); 8 adapter "
          "parameters", file=sys.stderr)
if offload:
    print("[t] info optimizer offload: 17.045 GiB of host buffers held (moe-train plan: 17.044 GiB)",
          file=sys.stderr)
"""


def executable(path: Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def gpu_check(args, env):
    return subprocess.run([str(ROOT / "scripts" / "gpu-check"), *args], env=env,
                          capture_output=True, text=True, timeout=300)


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def key_of(summary: str, step: str) -> str:
    m = re.search(rf"^\| {re.escape(step)} \| (\w+) \| [0-9.]+ \| (.*) \|$", summary, re.M)
    return f"{m.group(1)}: {m.group(2)}" if m else f"(no {step} row)"


# Six tests, as moe_gpu_tests names them; the sanitizers' default filter selects three of them.
TESTS = ["Grid/PermuteGpu.ForwardAndBackwardMatchReference/fp32_T7_E8_k2",
         "Grid/PermuteGpu.ForwardAndBackwardMatchReference/bf16_T7_E64_k8",
         "CudaGraphGpu.SameLossesAsEager",
         "NcclGpu.WorldOfOneRunsEveryCollectiveAndTheReducer",
         "NcclGpu.ExpertAllToAllWorldOfOneMatchesTheLocalPath",
         "Grid/RouterGpu.ForwardBackwardMatchReference/fp32_T7_E8_k2"]


def whole_runs(tmp: Path):
    build = tmp / "build"
    executable(build / "tests" / "moe_gpu_tests", FAKE_GTEST)
    executable(build / "src" / "moe-train", FAKE_MOE_TRAIN)
    executable(tmp / "bin" / "compute-sanitizer", FAKE_SANITIZER)
    calls = tmp / "calls"
    base_env = dict(os.environ, FAKE_TESTS=",".join(TESTS), FAKE_CALLS=str(calls),
                    GPU_CHECK_DATA_DIR=str(tmp / "data"), PATH=f"{tmp / 'bin'}:{os.environ['PATH']}")
    base_env.pop("GTEST_FILTER", None)

    def run(name, args, **env):
        calls.write_text("")
        out = tmp / name
        p = gpu_check([str(out), "--build-dir", str(build), *args], dict(base_env, **env))
        return p, out, read(out / "summary.md"), calls.read_text().splitlines()

    # A crash in test 3 of 6 reruns only 4..6, by name; a second crash in 5 reruns only 6. What
    # finished is kept; the step fails and names both; packed.
    p, out, summary, seen = run("crash", ["--only", "gpu-tests,memcheck", "--pack"],
                                FAKE_CRASH=f"{TESTS[2]},{TESTS[4]}")
    key = key_of(summary, "gpu-tests")
    check(p.returncode == 1 and key == (
        f"fail: 4 passed, 0 failed, 0 skipped of 6; crashed: {TESTS[2]} (exit 139); crashed: "
        f"{TESTS[4]} (exit 139); 3 runs"), f"two crashes named, the rest passed: {key}")
    gpu_calls = seen[:4]
    check(gpu_calls == ["LIST", "*", ":".join(TESTS[3:]), TESTS[5]],
          f"the reruns are exactly the tests after the crash: {gpu_calls}")
    check(key_of(summary, "memcheck").startswith("pass: ERROR SUMMARY: 0 errors; 3 passed"),
          f"memcheck on its filter's cases: {key_of(summary, 'memcheck')}")
    check(sorted(f.name for f in out.iterdir()) == ["logs.tar.gz", "summary.md"],
          f"--pack leaves summary.md and logs.tar.gz: {sorted(f.name for f in out.iterdir())}")
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = sorted(tar.getnames())
        log = tar.extractfile("gpu-tests.log").read().decode()
    check({"gpu-tests-3.xml", "gpu-tests.log", "memcheck.xml"} <= set(names) and
          "gpu-tests.xml" not in names and "gpu-tests-2.xml" not in names,
          f"the packed files (a crashed run writes no XML): {names}")
    runs = [log.count(f"[ RUN      ] {t}\n") for t in TESTS]
    check(runs == [1] * 6, f"each test ran once: {runs}")
    check(f"--gtest_filter={':'.join(TESTS[3:])}" in log and "=== gpu-tests: fail (exit 1)" in log
          and re.search(r"^# NcclGpu +2 +1 ", log, re.M),
          "the reruns' commands, the suite table and the step's end are logged")
    check("2 files in OUTDIR: <= 8, all come back" in summary and "**FAIL (1 failed)**" in summary,
          "the summary's verdict and file count")

    # A hang cut at the step's budget: the tests that finished are in the summary, the hung one
    # is named, the rest are counted as not run.
    p, out, summary, seen = run("hang", ["--only", "gpu-tests"], FAKE_HANG=TESTS[2],
                                GPU_CHECK_STEP_BUDGETS="gpu-tests=8")
    key = key_of(summary, "gpu-tests")
    check(p.returncode == 1 and key == (
        f"fail: 2 passed, 0 failed, 0 skipped of 6; hung: {TESTS[2]} (cut at the step's end); "
        f"not run: 3 (no time left), from {TESTS[3]}"), f"a hang at the budget: {key}")
    log = read(out / "gpu-tests.log")
    check(f"[       OK ] {TESTS[1]} (1 ms)" in log and "the step's time is up: ended" in log and
          seen == ["LIST", "*"], "the finished tests' lines are kept in the log; no rerun")

    # A hang caught by the stall limit: ended, and the tests after it run.
    p, out, summary, seen = run("stall", ["--only", "gpu-tests"], FAKE_HANG=TESTS[2],
                                GPU_CHECK_TEST_STALL_S="1.5")
    key = key_of(summary, "gpu-tests")
    check(p.returncode == 1 and key == (
        f"fail: 5 passed, 0 failed, 0 skipped of 6; hung: {TESTS[2]} (no result after 1.5 s); "
        "2 runs") and seen == ["LIST", "*", ":".join(TESTS[3:])],
          f"a stalled test is ended and the rest run: {key}")

    # A failure: named once; no rerun. Without a crash every step passes.
    p, out, summary, seen = run("fail", ["--only", "gpu-tests"], FAKE_FAIL=TESTS[1])
    key = key_of(summary, "gpu-tests")
    check(p.returncode == 1 and key == f"fail: 5 passed, 1 failed, 0 skipped of 6; failed: {TESTS[1]}"
          and seen == ["LIST", "*"], f"a failed test: {key}")
    p, out, summary, seen = run("pass", ["--only", "gpu-tests,racecheck"])
    check(p.returncode == 0 and "**PASS**" in summary and
          key_of(summary, "gpu-tests") == "pass: 6 passed, 0 failed, 0 skipped of 6",
          f"a clean run passes (exit {p.returncode}): {key_of(summary, 'gpu-tests')}")
    check(key_of(summary, "racecheck").startswith("pass: ERROR SUMMARY: 0 errors; 3 passed"),
          "racecheck's verdict from the XML its gtest wrote")
    check("--kernel-name kns=" in read(out / "racecheck.log"),
          "racecheck names our kernels from the sources")

    # The training runs: data made once, the plan and the run, peak against the plan.
    p, out, summary, seen = run("train", ["--only", "lora-bf16,offload-1b"])
    lora, off = key_of(summary, "lora-bf16"), key_of(summary, "offload-1b")
    check(p.returncode == 0 and lora == "pass: 30 steps, 50,000 tokens/s, loss 10.390 -> 10.100; "
          "peak 9.8 GiB, plan 10.0 GiB (+2.0%); base BFloat16",
          f"the LoRA run against its plan: {lora}")
    check(off == "pass: 8 steps, 50,000 tokens/s, loss 10.390 -> 10.320; peak 9.8 GiB, plan "
          "10.0 GiB (+2.0%); host buffers 17.0 GiB, plan 17.0 GiB", f"the offload run: {off}")
    check(seen.count("moe-train make-synthetic") == 1 and seen.count("moe-train plan") == 2,
          f"the data is made once for both: {seen}")
    check(json.loads(read(out / "lora-bf16" / "plan.json"))["peak_bytes"] == 10 * 2**30 and
          (out / "offload-1b" / "metrics.jsonl").is_file(), "plan.json and metrics.jsonl are kept")
    p, out, summary, seen = run("train-off", ["--only", "lora-bf16"], FAKE_PEAK_GIB="12",
                                FAKE_RUN_STEPS="20")
    lora = key_of(summary, "lora-bf16")
    check(p.returncode == 1 and "!! 20 of 30 steps" in lora and
          "!! plan off by -16.7% (bar 15%)" in lora, f"short of steps, beyond the bar: {lora}")

    # A budget too small for a step: skipped and reported, never started short; the next step,
    # which fits, runs; the run is INCOMPLETE.
    p, out, summary, seen = run("budget", ["--only", "gpu-tests,racecheck", "--budget", "60"])
    check(p.returncode == 0 and "| gpu-tests | skip | 0.0 | needs 80 s, 5" in summary and
          "| racecheck | pass |" in summary and
          "INCOMPLETE (skipped for want of time: gpu-tests)" in summary,
          f"a step that does not fit is skipped: {summary.splitlines()[2:3]}")
    # bench gives way: skipped without its minimum, which does not make the run incomplete.
    p, out, summary, seen = run("bench", ["--only", "bench", "--budget", "20"])
    check(p.returncode == 0 and "| bench | skip | 0.0 | gave way: 15 s left, needs 30 s |" in summary
          and "**PASS**" in summary, f"bench gives way: {key_of(summary, 'bench')}")

    # Shell steps: what configure exports (a build dir configured elsewhere) reaches build.
    foreign = tmp / "foreign"
    foreign.mkdir()
    (foreign / "build.ninja").write_text("")
    (foreign / "CMakeCache.txt").write_text("CMAKE_HOME_DIRECTORY:INTERNAL=/elsewhere\n")
    out = tmp / "shell"
    p = gpu_check([str(out), "--only", "configure,build", "--build-dir", str(foreign)], base_env)
    summary = read(out / "summary.md")
    check("| configure | skip |" in summary and "configured from /elsewhere: used as it is" in summary
          and "| build | skip | " in summary and "foreign build dir" in summary,
          "configure's FOREIGN_BUILD reaches the build step")

    # The dry run writes nothing and shows every step, the plan and gpu-tests' estimates.
    out = tmp / "dry"
    p = gpu_check([str(out), "--dry-run", "--full-ctest"], base_env)
    steps = [n for n, _, _ in runner.STEP_TABLE if n != "bench"]
    check(p.returncode == 0 and not out.exists() and
          all(f"### {s} (budget" in p.stdout for s in steps) and "### bench (gives way" in p.stdout,
          "--dry-run prints every step and writes nothing")
    check(re.search(r"^total +515 s", runner_dry(base_env), re.M) and
          "timeout_s: 575" in runner_dry(base_env),
          "the default dry run: 515 s, the command's timeout 575 s")
    check(re.search(r"#   Grid/RouterGpu +200 +7\.5", p.stdout) and
          re.search(r"#   total +\d+ +\d+\.\d   \+ 3 reruns' start-up 9 s: \d+ s, fits in 80 s",
                    p.stdout), "the dry run shows each suite's estimate and that they fit")
    check("moe-train plan --config" in p.stdout and "training.train_iters=30" in p.stdout and
          "zero_optimization.offload_optimizer.device=cpu" in p.stdout,
          "the dry run shows the training runs' commands")
    p = gpu_check([str(out), "--only", "nope"], base_env)
    check(p.returncode == 2 and "no step 'nope'" in p.stderr, "a bad step name is exit 2")


def runner_dry(env) -> str:
    return gpu_check(["/nonexistent/out", "--dry-run"], env).stdout


def main():
    recorded_verdicts()
    console_verdicts()
    plan_and_budgets()
    training_verdicts()
    with tempfile.TemporaryDirectory() as tmp:
        whole_runs(Path(tmp))
    if failures:
        print(f"{len(failures)} checks failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
