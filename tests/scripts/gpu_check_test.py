#!/usr/bin/env python3
"""scripts/gpu-check's runner (scripts/gpu_check_runner.py) on the CPU: verdicts from gtest XML and
console logs recorded from our own test binaries (tests/scripts/recorded/: a run with no device,
a failing run, a run whose suite set-up failed, a run killed by SIGSEGV), then whole runs of the
command with a stand-in moe_gpu_tests that crashes in one test (the rerun without its suite), a
stand-in compute-sanitizer, a budget too small for every step, the shell steps' variables carried
from one step to the next, the summary and the packing.

usage: gpu_check_test.py (no arguments; run from anywhere)
"""
import importlib.util
import os
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


def budgets_and_files():
    check(runner.step_timeout(75, 400, 100) == 300, "a step gets what the later steps leave")
    check(runner.step_timeout(75, 100, 100) == 75, "never less than its budget")
    check(runner.step_timeout(75, 74, 0) is None, "skipped when its budget no longer fits")
    check(runner.quote(["a", "b c", "it's", "--x=1;2"]) == "a 'b c' 'it'\\''s' '--x=1;2'",
          "commands quoted as the shell functions quote them")
    line, ok = runner.files_line(9, True)
    check(not ok and "more than 8, not all come back" in line, "with --pack, 9 files fail")
    line, ok = runner.files_line(9, False)
    check(ok and "--pack makes them 2" in line, "without --pack, 9 files are a note")


# --- whole runs with stand-in programs -----------------------------------------------------------
FAKE_GTEST = r'''#!/usr/bin/env python3
# A stand-in for moe_gpu_tests: googletest's console lines and XML for FAKE_TESTS; the test named
# by FAKE_CRASH kills the process with SIGSEGV, as a crashing CUDA test would.
import os, signal, sys
tests = os.environ["FAKE_TESTS"].split(",")
crash = os.environ.get("FAKE_CRASH", "")
xml, excluded = os.environ.get("GTEST_OUTPUT", "")[4:], []
for a in sys.argv[1:]:
    if a.startswith("--gtest_output=xml:"):
        xml = a[len("--gtest_output=xml:"):]
    if a.startswith("--gtest_filter=-"):
        excluded = [p[:-2] for p in a[len("--gtest_filter=-"):].split(":")]
run = [t for t in tests if t.split(".")[0] not in excluded]
print(f"[==========] Running {len(run)} tests", flush=True)
for t in run:
    print(f"[ RUN      ] {t}", flush=True)
    if t == crash:
        os.kill(os.getpid(), signal.SIGSEGV)
    print(f"[       OK ] {t} (1 ms)", flush=True)
cases = "".join(f'<testcase name="{t.split(".")[1]}" status="run" result="completed" '
                f'classname="{t.split(".")[0]}"/>' for t in run)
with open(xml, "w") as f:
    f.write(f'<?xml version="1.0"?><testsuites tests="{len(run)}"><testsuite>{cases}'
            '</testsuite></testsuites>')
print(f"[  PASSED  ] {len(run)} tests.")
'''

FAKE_SANITIZER = r'''#!/bin/sh
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
'''


def executable(path: Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def gpu_check(args, env):
    return subprocess.run([str(ROOT / "scripts" / "gpu-check"), *args], env=env,
                          capture_output=True, text=True, timeout=300)


def whole_runs(tmp: Path):
    build = tmp / "build"
    executable(build / "tests" / "moe_gpu_tests", FAKE_GTEST)
    executable(tmp / "bin" / "compute-sanitizer", FAKE_SANITIZER)
    env = dict(os.environ, FAKE_TESTS="PermuteGpu.A,CudaGraphGpu.Eager,CudaGraphGpu.Graph,RouterGpu.B",
               FAKE_CRASH="CudaGraphGpu.Eager", PATH=f"{tmp / 'bin'}:{os.environ['PATH']}")

    # A crash: named, and the rest run again without its suite; the step fails; packed.
    out = tmp / "crash"
    p = gpu_check([str(out), "--only", "gpu-tests,memcheck", "--build-dir", str(build), "--pack"], env)
    summary = (out / "summary.md").read_text() if (out / "summary.md").exists() else ""
    check(p.returncode == 1, f"a crash fails the run (exit {p.returncode})")
    check("crashed: CudaGraphGpu.Eager (exit 139); then 2 passed, 0 failed, 0 skipped of 2" in summary,
          "the crashing test is named and the others pass in the rerun")
    check("| memcheck | fail |" in summary and "ERROR SUMMARY: 0 errors" in summary,
          "memcheck reports the sanitizer's summary (its own run crashes too)")
    check(sorted(f.name for f in out.iterdir()) == ["logs.tar.gz", "summary.md"],
          f"--pack leaves summary.md and logs.tar.gz: {sorted(f.name for f in out.iterdir())}")
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = sorted(tar.getnames())
        log = tar.extractfile("gpu-tests.log").read().decode()
    check("gpu-tests-2.xml" in names and "gpu-tests.log" in names and "memcheck.xml" not in names,
          f"the packed files: {names}")
    check("--gtest_filter=-CudaGraphGpu.*" in log and "=== gpu-tests: fail (exit 1)" in log,
          "the rerun's command and the step's end are logged")
    check("2 files in OUTDIR: <= 8, all come back" in summary and "**FAIL (2 failed)**" in summary,
          "the summary's verdict and file count")

    # No crash: every step passes; the sanitizer's XML comes through GTEST_OUTPUT.
    out = tmp / "pass"
    env_pass = dict(env, FAKE_CRASH="")
    p = gpu_check([str(out), "--only", "gpu-tests,racecheck", "--build-dir", str(build)], env_pass)
    summary = (out / "summary.md").read_text()
    check(p.returncode == 0 and "**PASS**" in summary, f"a clean run passes (exit {p.returncode})")
    check("| racecheck | pass |" in summary and "4 passed, 0 failed, 0 skipped of 4" in summary,
          "racecheck's verdict from the XML its gtest wrote")
    racelog = (out / "racecheck.log").read_text()
    check("--kernel-name kns=" in racelog, "racecheck names our kernels from the sources")

    # A budget too small for a step: skipped and reported, never started short; the next step,
    # which fits, runs; the run is INCOMPLETE.
    out = tmp / "budget"
    p = gpu_check([str(out), "--only", "gpu-tests,racecheck", "--build-dir", str(build),
                   "--budget", "60"], env_pass)
    summary = (out / "summary.md").read_text()
    check(p.returncode == 0 and "| gpu-tests | skip | 0.0 | needs 75 s, 5" in summary and
          "| racecheck | pass |" in summary and
          "INCOMPLETE (skipped for want of time: gpu-tests)" in summary,
          f"a step that does not fit is skipped: {summary.splitlines()[2]}")

    # Shell steps: what configure exports (a build dir configured elsewhere) reaches build.
    foreign = tmp / "foreign"
    foreign.mkdir()
    (foreign / "build.ninja").write_text("")
    (foreign / "CMakeCache.txt").write_text("CMAKE_HOME_DIRECTORY:INTERNAL=/elsewhere\n")
    out = tmp / "shell"
    p = gpu_check([str(out), "--only", "configure,build", "--build-dir", str(foreign)], env)
    summary = (out / "summary.md").read_text()
    check("| configure | skip |" in summary and "configured from /elsewhere: used as it is" in summary
          and "| build | skip | " in summary and "foreign build dir" in summary,
          "configure's FOREIGN_BUILD reaches the build step")

    # The dry run writes nothing and shows every step.
    out = tmp / "dry"
    p = gpu_check([str(out), "--dry-run", "--full-ctest"], env)
    check(p.returncode == 0 and not out.exists() and
          all(f"### {s} (budget" in p.stdout for s, _, _ in runner.STEP_TABLE),
          "--dry-run prints every step and writes nothing")
    p = gpu_check([str(out), "--only", "nope"], env)
    check(p.returncode == 2 and "no step 'nope'" in p.stderr, "a bad step name is exit 2")


def main():
    recorded_verdicts()
    budgets_and_files()
    with tempfile.TemporaryDirectory() as tmp:
        whole_runs(Path(tmp))
    if failures:
        print(f"{len(failures)} checks failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
