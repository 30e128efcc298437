"""The multi-GPU systemd unit's ExecStart line, run as systemd would run it: the unit, the
moe-train-launch wrapper and the binary as `cmake --install` puts them into a scratch prefix
(its bare torchrun resolved by the wrapper from the runtime the installed binary finds, the
build's venv here; 2 CPU ranks instead of 8 GPUs):
  - a bad config exits 2, so RestartPreventExitStatus=2 stops the restart loop (before the
    launcher wrapper torchrun's exit 1 restarted it forever);
  - a crash (a rank's training failure, exit 3) exits non-zero and not 2: systemd restarts it;
  - a good run exits 0.
usage: multigpu_unit_test.py CMAKE BUILD_DIR"""
import json
import os
import pathlib
import shlex
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from e2e import Checks, make_synthetic  # noqa: E402

CMAKE, BUILD = sys.argv[1], pathlib.Path(sys.argv[2])
check = Checks()

with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    prefix = tmp / "prefix"
    for component in ("runtime", "launcher", "systemd"):
        subprocess.run([CMAKE, "--install", str(BUILD), "--prefix", str(prefix), "--component", component],
                       check=True, stdout=subprocess.DEVNULL)
    BIN = str(prefix / "bin/moe-train")
    unit = (prefix / "lib/systemd/system/moe-train-multigpu.service").read_text()
    exec_start = next(l.split("=", 1)[1] for l in unit.splitlines() if l.startswith("ExecStart="))
    prevent = next(l.split("=", 1)[1] for l in unit.splitlines() if l.startswith("RestartPreventExitStatus="))
    check(prevent.split() == ["2"], f"RestartPreventExitStatus={prevent}")
    check(exec_start.startswith(f"{prefix}/libexec/moe-train/moe-train-launch torchrun ") and f" {BIN} " in exec_start,
          f"ExecStart names the installed wrapper and binary: {exec_start}")
    make_synthetic(BIN, tmp / "data", vocab=32, programs=2, doc_len=33, train_docs=200, valid_docs=16)
    good = {"train_batch_size": 8,
            "model": {"vocab_size": 128, "seq_len": 32, "hidden_size": 32, "num_layers": 2, "num_heads": 2},
            "moe": {"num_experts": 4, "top_k": 2, "expert_hidden_size": 64},
            "data": {"train_path": str(tmp / "data/train.h5")},
            "training": {"train_iters": 4, "eval_interval": 0, "device": "cpu", "output_dir": str(tmp / "out")},
            "distributed": {"timeout_s": 20}}

    def run_unit(cfg, env=None):
        (tmp / "ds_config.json").write_text(json.dumps(cfg))
        args = shlex.split(exec_start.replace("/srv/moe-train", str(tmp))
                           .replace("--nproc-per-node 8", "--nproc-per-node 2"))
        # --standalone picks a free port itself; several tests may run side by side.
        return subprocess.run(args, capture_output=True, text=True, cwd=tmp, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})

    bad = json.loads(json.dumps(good))
    bad["optimizer"] = {"params": {"lrr": 0.1}}
    r = run_unit(bad)
    check(r.returncode == 2 and "unknown key 'optimizer.params.lrr'" in r.stderr,
          f"bad config through the unit's ExecStart: exit {r.returncode} (2 = not restarted)")

    r = run_unit(good, {"MOE_TEST_FAKE_OOM_AT_STEP": "2"})
    check(r.returncode not in (0, 2), f"a crashed run: exit {r.returncode} (restarted by Restart=on-failure)")

    r = run_unit(good)
    check(r.returncode == 0, f"a good run: exit {r.returncode} {r.stderr[-400:]}")

sys.exit(check.exit_code())
