"""The Debian package as CI builds it: `cpack -G DEB` from the build directory gives
moe-train_<version>_amd64.deb, whose contents (dpkg-deb -c) hold the binary, both units, the
wrapper, the completion and the man page, whose control file names its Debian dependencies, and
whose postinst / postrm reload systemd (not under dpkg --root).
Installed with `dpkg --root` into a scratch root (the real root is left alone): the binary there
runs --version and --help, `systemd-analyze --root verify` of both installed units is clean, and
`dpkg --root -r` then `--purge` removes every file it installed.
usage: deb_test.py CPACK BUILD_DIR"""
import pathlib
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from e2e import Checks  # noqa: E402

CPACK, BUILD = sys.argv[1], pathlib.Path(sys.argv[2])
check = Checks()
if not shutil.which("dpkg-deb") or not shutil.which("dpkg"):
    print("dpkg not installed: skipping")
    sys.exit(77)

with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    r = subprocess.run([CPACK, "-G", "DEB", "--config", str(BUILD / "CPackConfig.cmake"), "-B", str(tmp / "pkg")],
                       capture_output=True, text=True, timeout=600)
    debs = sorted((tmp / "pkg").glob("moe-train_*_amd64.deb"))
    check(r.returncode == 0 and len(debs) == 1, f"cpack -G DEB: exit {r.returncode}, {debs} {r.stderr[-400:]}")
    if not debs:
        sys.exit(check.exit_code())
    deb = debs[0]
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True).stdout
    wanted = ["./usr/bin/moe-train", "./usr/bin/moe-train-setup-runtime", "./usr/libexec/moe-train/moe-train",
              "./usr/libexec/moe-train/runtime.sh", "./usr/libexec/moe-train/moe-train-launch",
              "./usr/lib/systemd/system/moe-train.service", "./usr/lib/systemd/system/moe-train-multigpu.service",
              "./usr/share/bash-completion/completions/moe-train", "./usr/share/man/man1/moe-train.1",
              "./usr/share/moe-train/configs/tiny.json"]
    paths = {line.split()[-1] for line in listing.splitlines() if line.strip()}
    missing = [w for w in wanted if w not in paths and w.replace("/usr/lib/", "/lib/") not in paths]
    check(not missing, f"dpkg-deb -c lists the binary, units, wrapper, completion, man page: missing {missing}")
    info = subprocess.run(["dpkg-deb", "-f", str(deb), "Depends"], capture_output=True, text=True).stdout
    for lib in ("libhdf5", "libspdlog", "libicu", "libpcre2", "libcurl", "libxxhash", "libzstd",
                "libsentencepiece", "libsystemd", "python3-venv"):
        check(lib in info, f"Depends names {lib}: {info.strip()[:200]}")

    # The maintainer scripts: systemd reloads its units after install and removal, except under
    # dpkg --root (DPKG_ROOT set). Run here with a recording systemctl, as root on a booted
    # systemd would run them (the /run/systemd/system test is the scripts' own, so it is
    # rewritten to a directory this test makes).
    control = tmp / "control"
    subprocess.run(["dpkg-deb", "-e", str(deb), str(control)], check=True)
    fake = tmp / "fakebin"
    fake.mkdir()
    (fake / "systemctl").write_text(f'#!/bin/sh\necho "$@" >> {tmp}/systemctl.log\n')
    (fake / "systemctl").chmod(0o755)
    (tmp / "run-systemd").mkdir()
    for script, arg in (("postinst", "configure"), ("postrm", "remove"), ("postrm", "purge")):
        path = control / script
        check(path.exists() and path.stat().st_mode & 0o111, f"the package has an executable {script}")
        if not path.exists():
            continue
        text = path.read_text().replace("/run/systemd/system", str(tmp / "run-systemd"))
        (tmp / script).write_text(text)
        for dpkg_root, want in (("", 1), ("/some/root", 0)):
            log = tmp / "systemctl.log"
            log.unlink(missing_ok=True)
            env = {"PATH": f"{fake}:/usr/bin:/bin", "DPKG_ROOT": dpkg_root}
            r = subprocess.run(["sh", str(tmp / script), arg], env=env, capture_output=True, text=True)
            calls = log.read_text().splitlines() if log.exists() else []
            check(r.returncode == 0 and calls == ["--system daemon-reload"] * want,
                  f"{script} {arg} (DPKG_ROOT={dpkg_root!r}): exit {r.returncode}, systemctl calls {calls}")

    # A scratch root with an empty dpkg database: dependencies are the real system's (forced).
    root = tmp / "root"
    for sub in ("var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers"):
        (root / sub).mkdir(parents=True)
    for f in ("var/lib/dpkg/status", "var/lib/dpkg/available"):
        (root / f).write_text("")
    r = subprocess.run(["dpkg", f"--root={root}", "--force-depends", "--force-not-root",
                        "--force-script-chrootless", "--log=/dev/null", "-i", str(deb)],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"dpkg --root -i: exit {r.returncode} {r.stderr[-400:]}")
    installed = [p for p in root.rglob("*") if p.is_file() and "var/lib/dpkg" not in str(p)]
    binary = root / "usr/bin/moe-train"
    r = subprocess.run([str(binary), "--version"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    check(r.returncode == 0 and "commit" in r.stdout, f"the installed binary runs --version: {r.stdout!r} {r.stderr[-200:]!r}")
    r = subprocess.run([str(binary), "--help"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    check(r.returncode == 0 and "make-synthetic" in r.stdout, "the installed binary runs --help")
    if shutil.which("systemd-analyze") and pathlib.Path("/usr/lib/systemd/system/sysinit.target").exists():
        units = [u for u in ("usr/lib/systemd/system", "lib/systemd/system") if (root / u).is_dir()]
        # The scratch root borrows the system's own units (the targets ours are ordered after).
        for f in pathlib.Path("/usr/lib/systemd/system").iterdir():
            dest = root / units[0] / f.name
            if f.is_file() and not f.is_symlink() and not dest.exists():
                shutil.copy2(f, dest)
        for unit in ("moe-train.service", "moe-train-multigpu.service"):
            r = subprocess.run(["systemd-analyze", f"--root={root}", "verify", f"/{units[0]}/{unit}"],
                               capture_output=True, text=True,
                               env={"PATH": "/usr/bin:/bin", "MANPATH": str(root / "usr/share/man")})
            out = (r.stdout + r.stderr).strip()
            check(r.returncode == 0 and unit not in out, f"systemd-analyze --root verify {unit}: {out[-400:]}")
    r = subprocess.run(["dpkg", f"--root={root}", "--force-not-root", "--force-script-chrootless",
                        "--log=/dev/null", "--purge", "moe-train"], capture_output=True, text=True)
    left = [p for p in installed if p.exists()]  # (the borrowed units are not the package's)
    check(r.returncode == 0 and not left, f"dpkg --root --purge removes every file: exit {r.returncode}, left {left[:5]}")
    print(f"{deb.name}: {deb.stat().st_size / 2**20:.1f} MiB, {len(installed)} files installed and removed")

sys.exit(check.exit_code())
