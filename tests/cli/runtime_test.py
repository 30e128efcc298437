"""The package on a machine that has nothing else: the .deb installed with dpkg into a mount
namespace whose /usr, /etc and /var are overlays (the real root is left alone), /opt/moe-train
hidden (no runtime where this build's venv was) and /srv empty. The lines of docs/build.md's
walkthrough block run as written there (the setup line with --venv on a scratch path and --wheels
when a wheel directory was staged; `systemctl enable --now` becomes the unit's ExecStart run as
the unit runs it). Before the setup line:
  - `moe-train --version`, `moe-train train`, both units' ExecStart (as their User=, in their
    WorkingDirectory=, with their Environment=) and moe-train-launch exit 2 with one line naming
    what is missing, where it looked and the command that installs it; nothing is written;
  - a runtime of another torch version (recorded, or MOE_LIBTORCH_DIR) is refused naming both.
After it: the venv is recorded in /etc/moe-train/runtime.conf, a second run is idempotent, the
installed binary trains tiny.json for 6 steps from another directory under env -i, and the unit
trains, then stops with a checkpoint on SIGTERM (exit 0).
usage: runtime_test.py CPACK BUILD_DIR BUILD_MD  (as root: skipped without mount namespaces)"""
import glob
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from e2e import Checks  # noqa: E402

ROOT_PATH = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
CLEAN = {"PATH": "/usr/bin:/bin"}
WHEELS = os.environ.get("MOE_WHEELS", "/opt/moe-train/wheels")


def walkthrough(build_md):
    """The shell lines of docs/build.md between <!-- walkthrough --> and <!-- /walkthrough -->."""
    text = pathlib.Path(build_md).read_text()
    block = text.split("<!-- walkthrough -->", 1)[1].split("<!-- /walkthrough -->", 1)[0]
    return [l for l in block.splitlines() if l.strip() and not l.startswith("```")]


def unit_settings(path):
    """ExecStart, Environment, User, WorkingDirectory, RestartPreventExitStatus of a unit file."""
    lines = pathlib.Path(path).read_text().splitlines()
    get = lambda key: [l.split("=", 1)[1] for l in lines if l.startswith(key + "=")]
    env = dict(e.split("=", 1) for e in get("Environment"))
    # systemd's PATH for services; OMP threads as `systemctl edit` would set them on 2 cores
    env.update({"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin", "OMP_NUM_THREADS": "2"})
    return {"exec": shlex.split(get("ExecStart")[0]), "env": env, "user": get("User")[0],
            "cwd": get("WorkingDirectory")[0], "prevent": get("RestartPreventExitStatus")}


def as_unit(unit, **kw):
    # setpriv execs the command itself (as User= does): the signals go to it, not to a session.
    user = ["setpriv", f"--reuid={unit['user']}", f"--regid={unit['user']}", "--init-groups"]
    return subprocess.Popen([*user, *unit["exec"]], cwd=unit["cwd"], env=unit["env"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def one_line_exit_2(check, what, returncode, stderr, *needles):
    lines = stderr.strip().splitlines()
    ok = returncode == 2 and len(lines) == 1 and all(n in lines[0] for n in needles)
    check(ok, f"{what}: exit {returncode} (2), one line naming {needles}: {stderr.strip()[-400:]!r}")


def files_under(path):
    return sorted(str(p) for p in pathlib.Path(path).rglob("*"))


def no_runtime_checks(check, tmp):
    """Everything that must say "no runtime" in one line and exit 2, and write nothing."""
    single = unit_settings("/usr/lib/systemd/system/moe-train.service")
    multi = unit_settings("/usr/lib/systemd/system/moe-train-multigpu.service")
    before = files_under(single["cwd"])
    empty = tmp / "empty-dir"
    empty.mkdir()
    wants = ("LibTorch (torch ", "not found in /opt/moe-train/venv", "moe-train-setup-runtime")
    for args in (["--version"], ["train", "--config", f"{single['cwd']}/ds_config.json"]):
        r = subprocess.run(["moe-train", *args], capture_output=True, text=True, cwd=empty, env=CLEAN)
        one_line_exit_2(check, f"moe-train {args[0]} without a runtime", r.returncode, r.stderr, *wants)
        check(r.stdout == "", f"moe-train {args[0]}: nothing on stdout ({r.stdout[:100]!r})")
    for name, unit in (("moe-train.service", single), ("moe-train-multigpu.service", multi)):
        check(unit["prevent"] == ["2"], f"{name}: RestartPreventExitStatus={unit['prevent']}")
        p = as_unit(unit)
        out, err = p.communicate(timeout=120)
        one_line_exit_2(check, f"{name}'s ExecStart without a runtime", p.returncode, err, *wants)
    check(multi["exec"][1] == "torchrun", f"the multi-GPU unit names a bare torchrun: {multi['exec'][:2]}")
    r = subprocess.run(["/usr/libexec/moe-train/moe-train-launch", "torchrun", "--version"], capture_output=True,
                       text=True, env=CLEAN)
    one_line_exit_2(check, "moe-train-launch torchrun without a runtime", r.returncode, r.stderr, *wants)
    check(files_under(single["cwd"]) == before and not list(empty.iterdir()),
          "the failed starts wrote nothing (WorkingDirectory and the current directory unchanged)")

    # Another torch version: refused by name, whether recorded or named by MOE_LIBTORCH_DIR.
    fake = tmp / "other-torch"
    torch_dir = fake / "lib/python3.11/site-packages/torch"
    (torch_dir / "lib").mkdir(parents=True)
    (torch_dir / "lib/libtorch_cpu.so").write_bytes(b"")
    (torch_dir / "version.py").write_text("__version__ = '2.10.0+cu128'\ncuda = '12.8'\n")
    conf = pathlib.Path("/etc/moe-train/runtime.conf")
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(f"venv={fake}\n")
    built = re.search(r"MOE_TORCH_BUILT='([^']+)'", pathlib.Path("/usr/libexec/moe-train/runtime.sh").read_text())[1]
    r = subprocess.run(["moe-train", "--version"], capture_output=True, text=True, env=CLEAN)
    one_line_exit_2(check, "a recorded runtime of another torch", r.returncode, r.stderr, "torch 2.10.0+cu128",
                    f"built against torch {built}", str(conf))
    conf.unlink()
    r = subprocess.run(["moe-train", "--version"], capture_output=True, text=True,
                       env={**CLEAN, "MOE_LIBTORCH_DIR": str(torch_dir / "lib")})
    one_line_exit_2(check, "MOE_LIBTORCH_DIR with another torch", r.returncode, r.stderr, "torch 2.10.0+cu128",
                    f"built against torch {built}", "MOE_LIBTORCH_DIR")


def after_setup_checks(check, tmp, setup_line, runtime):
    conf = pathlib.Path("/etc/moe-train/runtime.conf")
    check(conf.exists() and f"venv={runtime}" in conf.read_text(), f"the venv is recorded in {conf}")
    check(not list(pathlib.Path("/opt/moe-train").iterdir()), "nothing went to the hidden default path")
    r = subprocess.run(setup_line, shell=True, capture_output=True, text=True, env=ROOT_PATH, timeout=600)
    check(r.returncode == 0 and "already holds" in r.stderr, f"a second setup run is idempotent: {r.stderr[-300:]!r}")
    work = tmp / "elsewhere"
    work.mkdir()
    r = subprocess.run(["moe-train", "make-synthetic", "--out", "data/tiny", "--train-docs", "200", "--valid-docs",
                        "32"], capture_output=True, text=True, cwd=work, env=CLEAN)
    check(r.returncode == 0, f"make-synthetic with the new runtime: exit {r.returncode} {r.stderr[-300:]}")
    r = subprocess.run(["moe-train", "--config", "/usr/share/moe-train/configs/tiny.json", "--set",
                        "training.train_iters=6", "--set", "training.eval_interval=3", "--set",
                        "training.eval_iters=1", "--set", "checkpoint.save_interval=3", "-q"],
                       capture_output=True, text=True, cwd=work, env=CLEAN, timeout=300)
    steps = (work / "runs/tiny/metrics.jsonl").read_text().count('"step"') if r.returncode == 0 else 0
    check(r.returncode == 0 and steps >= 6,
          f"tiny.json, 6 steps from another directory under env -i: exit {r.returncode}, {steps} metric lines "
          f"{r.stderr[-300:]!r}")


def run_unit_until_trained(check):
    """systemctl enable --now moe-train, as far as a container allows: the unit's ExecStart as the
    unit runs it, stopped by its KillSignal once it has trained a few steps."""
    unit = unit_settings("/usr/lib/systemd/system/moe-train.service")
    metrics = pathlib.Path(unit["cwd"]) / "runs/tiny/metrics.jsonl"
    p = as_unit(unit)
    deadline = time.time() + 240
    while time.time() < deadline and p.poll() is None:
        if metrics.exists() and metrics.read_text().count('"step"') >= 6:
            break
        time.sleep(1)
    trained = metrics.exists() and metrics.read_text().count('"step"') >= 6
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=240)
    checkpoints = sorted(glob.glob(str(metrics.parent / "checkpoints/step-*")))
    check(trained and p.returncode == 0 and checkpoints,
          f"the unit trains ({trained}), stops on SIGTERM with exit {p.returncode} (0) and a checkpoint "
          f"({checkpoints[-1:]}): {err[-400:]!r}")


def inside(tmp, deb, build_md):
    check = Checks()
    tmp = pathlib.Path(tmp)
    mount = lambda *a: subprocess.run(["mount", *a], check=True)
    wheels = tmp / "wheels"
    have_wheels = bool(glob.glob(f"{WHEELS}/torch-*.whl"))
    if have_wheels:
        wheels.mkdir()
        mount("--bind", WHEELS, str(wheels))
    for d in ("usr", "etc", "var"):
        (tmp / f"ov/{d}/upper").mkdir(parents=True)
        (tmp / f"ov/{d}/work").mkdir()
        mount("-t", "overlay", "overlay", "-o",
              f"lowerdir=/{d},upperdir={tmp}/ov/{d}/upper,workdir={tmp}/ov/{d}/work", f"/{d}")
    for hidden in ("/opt/moe-train", "/srv"):
        if os.path.isdir(hidden):
            (tmp / f"hide{hidden.replace('/', '-')}").mkdir()
            mount("--bind", str(tmp / f"hide{hidden.replace('/', '-')}"), hidden)
    runtime = tmp / "runtime"
    cwd = "/root" if os.path.isdir("/root") else "/"
    for line in walkthrough(build_md):
        cmd = line.split("#", 1)[0].strip()
        if cmd.startswith("cd "):
            cwd = cmd[3:].strip()
            continue
        if cmd.startswith("systemctl enable --now moe-train"):
            run_unit_until_trained(check)
            continue
        if cmd.startswith("dpkg -i"):
            cmd = re.sub(r"\S*moe-train_\S+_amd64\.deb", str(deb), cmd)
        setup = cmd.startswith("moe-train-setup-runtime")
        if setup:
            no_runtime_checks(check, tmp)
            cmd += f" --venv {runtime}" + (f" --wheels {wheels}" if have_wheels else "")
        r = subprocess.run(cmd, shell=True, capture_output=True, text=True, cwd=cwd, env=ROOT_PATH, timeout=900)
        check(r.returncode == 0, f"docs/build.md: `{cmd}`: exit {r.returncode} {r.stderr[-400:]!r}")
        if r.returncode != 0:
            break
        if setup:
            after_setup_checks(check, tmp, cmd, runtime)
    return check.exit_code()


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--inside":
        return inside(*sys.argv[2:])
    cpack, build, build_md = sys.argv[1:4]
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if os.geteuid() != 0 or probe.returncode != 0:
        print("needs root and mount namespaces (unshare -m): skipping")
        return 77
    check = Checks()
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        tmp.chmod(0o755)  # the unit's user reads the runtime under it
        r = subprocess.run([cpack, "-G", "DEB", "--config", f"{build}/CPackConfig.cmake", "-B", str(tmp / "pkg")],
                           capture_output=True, text=True, timeout=600)
        debs = sorted((tmp / "pkg").glob("moe-train_*_amd64.deb"))
        check(r.returncode == 0 and len(debs) == 1, f"cpack -G DEB: exit {r.returncode} {r.stderr[-300:]}")
        if not debs:
            return check.exit_code()
        (tmp / "ns").mkdir()
        r = subprocess.run(["unshare", "-m", "--propagation", "private", "/usr/bin/python3", __file__, "--inside",
                            str(tmp / "ns"), str(debs[0]), build_md])
        check(r.returncode == 0, f"the walkthrough in its mount namespace: exit {r.returncode}")
    return check.exit_code()


if __name__ == "__main__":
    sys.exit(main())
