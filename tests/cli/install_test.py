"""The install tree as an operator gets it: `cmake --install BUILD --prefix TMP/p`, then from
another directory with a clean environment (env -i PATH=/usr/bin:/bin) the installed binary
prints --version and --help, writes the demo's dataset and trains configs/tiny.json (a few
steps), `env` passes; the units name the installed paths and `systemd-analyze verify` them
(with the installed man page) is clean; the bash completion lists subcommands and options; the
man page renders.
usage: install_test.py CMAKE BUILD_DIR"""
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from e2e import Checks  # noqa: E402

CMAKE, BUILD = sys.argv[1], pathlib.Path(sys.argv[2])
check = Checks()
CLEAN = {"PATH": "/usr/bin:/bin"}

with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    p = tmp / "p"
    r = subprocess.run([CMAKE, "--install", str(BUILD), "--prefix", str(p)], capture_output=True, text=True)
    check(r.returncode == 0, f"cmake --install: exit {r.returncode} {r.stderr[-400:]}")
    files = ["bin/moe-train", "bin/moe-train-setup-runtime", "libexec/moe-train/moe-train",
             "libexec/moe-train/runtime.sh", "libexec/moe-train/moe-train-launch", "share/moe-train/configs/tiny.json",
             "share/moe-train/configs/grafana-dashboard.json", "share/moe-train/configs/prometheus.yml",
             "share/moe-train/docs/build.md", "share/moe-train/README.md",
             "lib/systemd/system/moe-train.service", "lib/systemd/system/moe-train-multigpu.service",
             "share/bash-completion/completions/moe-train", "share/man/man1/moe-train.1"]
    missing = [f for f in files if not (p / f).is_file()]
    check(not missing, f"installed files, missing: {missing}")
    for program in ("bin/moe-train", "bin/moe-train-setup-runtime", "libexec/moe-train/moe-train",
                    "libexec/moe-train/moe-train-launch"):
        check(os.access(p / program, os.X_OK), f"{program} is executable")

    work = tmp / "elsewhere"
    work.mkdir()
    binary = str(p / "bin/moe-train")

    def run(*args):
        return subprocess.run([binary, *args], capture_output=True, text=True, cwd=work, env=CLEAN, timeout=300)

    r = run("--version")
    check(r.returncode == 0 and "commit" in r.stdout and "LibTorch" in r.stdout and "CUDA" in r.stdout,
          f"--version in a clean environment: exit {r.returncode} {r.stdout!r} {r.stderr[-300:]!r}")
    r = run("--help")
    check(r.returncode == 0 and "make-synthetic" in r.stdout, f"--help: exit {r.returncode}")
    r = run("make-synthetic", "--out", "data/tiny", "--vocab", "64", "--programs", "4", "--doc-len", "65",
            "--train-docs", "200", "--valid-docs", "32")
    check(r.returncode == 0, f"make-synthetic: exit {r.returncode} {r.stderr[-300:]}")
    r = run("--config", str(p / "share/moe-train/configs/tiny.json"), "--set", "training.train_iters=6",
            "--set", "training.eval_interval=3", "--set", "training.eval_iters=1",
            "--set", "checkpoint.save_interval=3", "-q")
    check(r.returncode == 0 and "validation loss" in r.stdout and (work / "runs/tiny/metrics.jsonl").exists(),
          f"tiny training from the installed config: exit {r.returncode} {r.stdout[-300:]!r} {r.stderr[-300:]!r}")
    r = run("env", "--dir", str(work))
    check(r.returncode == 0 and "fail " not in r.stdout, f"env: exit {r.returncode} {r.stdout[-400:]}")

    # The units name the installed paths (written at install time for this prefix).
    units = p / "lib/systemd/system"
    single = (units / "moe-train.service").read_text()
    multi = (units / "moe-train-multigpu.service").read_text()
    check(f"ExecStart={p}/bin/moe-train " in single, "moe-train.service runs the installed binary")
    check(f"ExecStart={p}/libexec/moe-train/moe-train-launch " in multi and f" {p}/bin/moe-train " in multi,
          "moe-train-multigpu.service runs the installed wrapper and binary")
    if shutil.which("systemd-analyze"):
        for unit in ("moe-train.service", "moe-train-multigpu.service"):
            r = subprocess.run(["systemd-analyze", "verify", str(units / unit)], capture_output=True, text=True,
                               env={**CLEAN, "MANPATH": str(p / "share/man")})
            out = (r.stdout + r.stderr).strip()
            check(r.returncode == 0 and unit not in out, f"systemd-analyze verify {unit}: {out[-400:]}")
    else:
        print("skip systemd-analyze: not installed")

    # Bash completion: subcommands at the top, a subcommand's options after it.
    script = f"""source {p}/share/bash-completion/completions/moe-train
COMP_WORDS=(moe-train ''); COMP_CWORD=1; _moe_train; echo "${{COMPREPLY[*]}}"
COMP_WORDS=(moe-train make-synthetic --); COMP_CWORD=2; _moe_train; echo "${{COMPREPLY[*]}}"
COMP_WORDS=(moe-train config s); COMP_CWORD=2; _moe_train; echo "${{COMPREPLY[*]}}"
"""
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=CLEAN)
    lines = r.stdout.splitlines() + ["", "", ""]
    top, synth, config = lines[0].split(), lines[1].split(), lines[2].split()
    check(r.returncode == 0 and {"train", "config", "make-synthetic", "env", "completion", "--config"} <= set(top),
          f"completion, top level: {top}")
    check({"--out", "--vocab", "--doc-len", "--help"} <= set(synth), f"completion, make-synthetic --: {synth}")
    check(set(config) == {"show", "schema"}, f"completion, config s: {config}")

    if shutil.which("man"):
        r = subprocess.run(["man", "-l", str(p / "share/man/man1/moe-train.1")], capture_output=True, text=True,
                           env={**CLEAN, "MANPAGER": "cat", "PAGER": "cat"})
        check(r.returncode == 0 and "moe-train" in r.stdout and "--config" in r.stdout,
              f"man page renders: exit {r.returncode} {r.stderr[-200:]}")

sys.exit(check.exit_code())
