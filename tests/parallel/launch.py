"""What the torch.distributed tests share: a free port, moe-train under torchrun or as one process,
the small model they train and its synthetic dataset.
"""
import os
import pathlib
import socket
import subprocess
import sys

TORCHRUN = str(pathlib.Path(sys.executable).parent / "torchrun")

# 2 layers of 4 experts on 64-token windows: seconds per run on a 2-core VM.
SMALL_CONFIG = {
    "train_batch_size": 8, "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.003}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 5}},
    "model": {"vocab_size": 512, "seq_len": 64, "hidden_size": 64, "num_layers": 2, "num_heads": 4},
    "moe": {"num_experts": 4, "top_k": 2, "expert_hidden_size": 96},
    "training": {"train_iters": 30, "eval_interval": 0, "device": "cpu"},
    "distributed": {"timeout_s": 20},
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_data(binary, tmp):
    """A synthetic dataset under tmp/data; returns the config's data section."""
    subprocess.run([binary, "make-synthetic", "--out", tmp / "data", "--vocab", "512", "--programs", "4",
                    "--doc-len", "65", "--train-docs", "600", "--valid-docs", "16"], check=True,
                   capture_output=True)
    return {"train_path": str(tmp / "data/train.h5"), "valid_path": str(tmp / "data/valid.h5")}


def torchrun(binary, cfg, n, *sets, ok=True, env=None):
    """moe-train on n processes under torchrun (one thread each); exit 0 asserted when ok."""
    args = [TORCHRUN, "--no-python", "--nproc-per-node", str(n), "--master-port", str(free_port()),
            binary, "--config", cfg, "-q"]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    if ok:
        assert r.returncode == 0, r.stderr[-3000:]
    return r


def by_hand(binary, cfg, port, rank, *sets, env=None):
    """One of 2 ranks started as torchrun would start it (a Popen with pipes)."""
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", **(env or {})}
    args = [binary, "--config", cfg, "-q"]
    for s in sets:
        args += ["--set", s]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def single(binary, cfg, *sets):
    """moe-train as one process; exit 0 asserted."""
    args = [binary, "--config", cfg, "-q"]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return r
