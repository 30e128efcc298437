"""s3:// datasets and remote checkpoints against a real S3 HTTP server on 127.0.0.1 (moto's server
mode with signature checking, behind a fault-injecting proxy: tests/util/s3_server.py):
  - prepare-data --out s3:// (multipart uploads, manifest last; a second upload to the same prefix
    is refused), verify-data s3://;
  - training from s3:// gives losses bitwise equal to the same dataset read locally; 20+20 resume
    bitwise; a cache smaller than the dataset trains, evicting;
  - a corrupted object is caught by its checksum and named (training and verify-data);
  - checkpoint.remote: kill -9 after an upload, local output deleted, restart: resumed from the
    remote checkpoint, ends bitwise equal to an uninterrupted run; a killed upload leaves `latest`
    on the previous complete checkpoint;
  - faults while training: 503s for seconds, connections cut mid-object, the endpoint stopped and
    restarted: the run finishes with losses and the final weights unchanged;
  - wrong credentials, a missing bucket: exit 2 with one line, nothing written.
usage: cloud_storage_test.py MOE_TRAIN_BINARY
"""
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "util"))
from s3_server import S3Server  # noqa: E402

BIN = sys.argv[1]


def losses(run_dir):
    out = {}
    for line in open(run_dir / "metrics.jsonl"):
        rec = json.loads(line)
        if rec.get("type") == "train":
            out[rec["step"]] = rec["loss"]
    return out


def final_weights(run_dir, step):
    return (run_dir / "checkpoints" / f"step-{step:08d}" / "model.safetensors").read_bytes()


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    srv = S3Server()
    # Tiny parts and ranges so a 66 KB shard goes up in 2 parts and down in 5 ranged GETs.
    env = {**os.environ, **srv.env, "OMP_NUM_THREADS": "1", "MOE_S3_MULTIPART_BYTES": "65536",
           "MOE_S3_PART_BYTES": "65536", "MOE_S3_RANGE_BYTES": "16384"}
    try:
        rng = random.Random(7)
        words = ["".join(rng.choice("abcdefghij klmnop") for _ in range(rng.randint(2, 9))) for _ in range(300)]
        corpus = tmp / "corpus.txt"
        corpus.write_text("\n".join(" ".join(rng.choice(words) for _ in range(40)) for _ in range(1400)))

        def prepare(out, ok=True):
            r = subprocess.run([BIN, "prepare-data", corpus, "--out", out, "--shard-tokens", "32768",
                                "--valid-fraction", "0.05"], capture_output=True, text=True, env=env)
            assert (r.returncode == 0) == ok, r.stderr[-2000:]
            return r

        prepare(tmp / "local")
        r = prepare("s3://moe-test/ds")
        assert "manifest.json last" in r.stdout, r.stdout
        manifest = json.loads(srv.get("ds/manifest.json"))
        shards = [s["file"] for split in manifest["splits"].values() for s in split]
        local_manifest = json.loads((tmp / "local/manifest.json").read_text())
        assert manifest["splits"] == local_manifest["splits"], "same shards, sizes and checksums"
        for f in shards:
            assert srv.get(f"ds/{f}") == (tmp / "local" / f).read_bytes(), f
        shard_bytes = max(s["bytes"] for split in manifest["splits"].values() for s in split)
        total_bytes = sum(s["bytes"] for split in manifest["splits"].values() for s in split)
        print(f"prepare-data --out s3://: {len(shards)} shards ({total_bytes} bytes, multipart above 64 KiB) "
              f"byte-identical to the local dataset, manifest uploaded")
        r = prepare("s3://moe-test/ds", ok=False)
        assert r.returncode == 2 and "already holds a dataset" in r.stderr, r.stderr
        r = subprocess.run([BIN, "verify-data", "s3://moe-test/ds"], capture_output=True, text=True, env=env)
        assert r.returncode == 0 and "all shards match" in r.stdout, r.stdout + r.stderr
        print("prepare-data to an existing s3 dataset: exit 2; verify-data s3://: all shards match")

        cfg = tmp / "c.json"
        cfg.write_text(json.dumps({
            "train_batch_size": 4, "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.003}},
            "model": {"vocab_size": max(256, manifest["vocab_size"]), "seq_len": 64, "hidden_size": 64,
                      "num_layers": 2, "num_heads": 4},
            "moe": {"num_experts": 4, "top_k": 2, "expert_hidden_size": 96},
            "training": {"train_iters": 40, "eval_interval": 20, "device": "cpu"},
            "checkpoint": {"save_interval": 10, "keep_last": 2},
            "data": {"block_windows": 8}}))

        def train(out, data, *sets, extra_env=None, ok=True, quiet=True):
            args = [BIN, "--config", cfg] + (["-q"] if quiet else []) + [
                "--set", f"training.output_dir={out}", "--set", f'data.path="{data}"']
            for s in sets:
                args += ["--set", s]
            r = subprocess.run(args, capture_output=True, text=True, env={**env, **(extra_env or {})})
            if ok:
                assert r.returncode == 0, r.stderr[-3000:]
            return r

        train(tmp / "local-run", tmp / "local")
        want = losses(tmp / "local-run")
        assert len(want) == 40
        train(tmp / "s3-run", "s3://moe-test/ds")
        assert losses(tmp / "s3-run") == want, "s3:// losses differ from local ones"
        assert final_weights(tmp / "s3-run", 40) == final_weights(tmp / "local-run", 40)
        print("s3:// dataset: 40 losses and the final weights bitwise equal to the local dataset's")

        train(tmp / "s3-resume", "s3://moe-test/ds", "training.exit_interval=20")
        assert max(losses(tmp / "s3-resume")) == 20
        train(tmp / "s3-resume", "s3://moe-test/ds")
        assert losses(tmp / "s3-resume") == want, "20+20 from s3:// differs"
        print("s3:// dataset: 20 + 20 resume bitwise equal")

        cache = tmp / "small-cache"
        bound = 3 * shard_bytes
        r = train(tmp / "s3-small", "s3://moe-test/ds", f'data.cache_dir="{cache}"', f"data.cache_max_bytes={bound}",
                  quiet=False)
        assert losses(tmp / "s3-small") == want, "a small cache changed the losses"
        stats = [l for l in r.stderr.splitlines() if "shard cache" in l and "evicted" in l]
        assert stats, r.stderr[-3000:]
        evicted = int(stats[-1].split(" evicted")[0].split()[-1])
        assert evicted > 0, stats[-1]
        held = sum(f.stat().st_size for f in cache.rglob("*.h5"))
        assert held <= bound, (held, bound)
        print(f"cache of {bound} bytes < dataset {total_bytes}: trains bitwise, {evicted} evictions, "
              f"{held} bytes left in the cache")

        # Two ranks launched as srun launches them (SLURM_PROCID/NTASKS/LOCALID, no RANK) from one
        # s3:// dataset: each keeps a shard cache of its own (before, both took the rank-less
        # directory and one exited 2 on the other's lock). Data parallel over the same global
        # batch: the losses of the single process within 1e-5.
        import socket
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        srun_out = tmp / "s3-srun"
        procs = []
        for rank in (0, 1):
            srun_env = {**env, "SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(rank),
                        "SLURM_JOB_NODELIST": "localhost", "MASTER_PORT": str(port)}
            for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
                srun_env.pop(k, None)
            procs.append(subprocess.Popen(
                [BIN, "--config", cfg, "-q", "--set", f"training.output_dir={srun_out}",
                 "--set", 'data.path="s3://moe-test/ds"'],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=srun_env))
        for rank, p in enumerate(procs):
            _, err = p.communicate(timeout=300)
            assert p.returncode == 0, f"srun rank {rank}: exit {p.returncode}: {err[-2000:]}"
        got = losses(srun_out)
        assert sorted(got) == sorted(want), got
        worst = max(abs(got[k] - want[k]) / abs(want[k]) for k in got)
        assert worst <= 1e-5, worst
        caches = sorted(p.name for p in (srun_out / "shard-cache").iterdir())
        assert caches == ["rank-0", "rank-1"], caches
        print(f"srun-style ranks (SLURM_* only) from s3://: both train, caches {caches}, "
              f"losses within {worst:.1e} of one process")

        # Faults while training: 503s, connections cut mid-object, the endpoint down and back.
        slow = {"MOE_TEST_SLOW_UPDATE_MS": "120"}
        train(tmp / "local-100", tmp / "local", "training.train_iters=100")
        want100 = losses(tmp / "local-100")
        out = tmp / "faults"
        args = [BIN, "--config", cfg, "--set", f"training.output_dir={out}", "--set",
                'data.path="s3://moe-test/ds"', "--set", "training.train_iters=100", "--set",
                f"data.cache_max_bytes={2 * shard_bytes}", "--set", 'checkpoint.remote="s3://moe-test/faults"']
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**env, **slow})

        def steps_done():
            m = out / "metrics.jsonl"
            return sum(1 for l in m.read_text().splitlines() if '"train"' in l) if m.exists() else 0

        def wait_steps(n):
            t0 = time.time()
            while steps_done() < n:
                assert p.poll() is None, p.communicate()[1][-3000:]
                assert time.time() - t0 < 300
                time.sleep(0.1)

        wait_steps(5)
        srv.proxy.fail_for(4)
        wait_steps(30)
        srv.proxy.drop_next(4)
        wait_steps(55)
        srv.proxy.stop()
        time.sleep(4)
        srv.proxy.start()
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        assert losses(out) == want100, "faults changed the losses"
        assert final_weights(out, 100) == final_weights(tmp / "local-100", 100)
        assert srv.get("faults/latest").decode().strip() == "step-00000100"
        assert srv.proxy.injected["503"] > 0 and srv.proxy.injected["dropped"] > 0, srv.proxy.injected
        # Every injected fault costs one retry; retries beyond them were attempts refused while
        # the endpoint was down, so the outage was really hit.
        retried = sum(int(l.split(" requests retried")[0].split()[-1]) for l in err.splitlines()
                      if " requests retried" in l)
        injected = srv.proxy.injected["503"] + srv.proxy.injected["dropped"]
        assert retried > injected, (retried, srv.proxy.injected, err[-3000:])
        print(f"faults (503s for 4 s: {srv.proxy.injected['503']} answered; {srv.proxy.injected['dropped']} "
              f"objects cut mid-body; endpoint down 4 s: {retried - injected} refused attempts): exit 0, 100 "
              f"losses and weights bitwise, remote latest = step-00000100")

        # Remote checkpoints: kill -9 after an upload, local output gone, resume from the remote.
        out = tmp / "spot"
        args = [BIN, "--config", cfg, "-q", "--set", f"training.output_dir={out}", "--set",
                f'data.path="{tmp / "local"}"', "--set", 'checkpoint.remote="s3://moe-test/spot"']
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**env, **slow})
        t0 = time.time()
        while "spot/latest" not in srv.keys("spot/") or srv.get("spot/latest").decode().strip() != "step-00000020":
            assert p.poll() is None, p.communicate()[1][-3000:]
            assert time.time() - t0 < 300
            time.sleep(0.05)
        p.send_signal(signal.SIGKILL)
        p.communicate()
        shutil.rmtree(out)
        r = subprocess.run(args, capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        got = losses(out)
        assert all(got[s] == want[s] for s in got) and max(got) == 40 and min(got) in (21, 31), sorted(got)
        assert final_weights(out, 40) == final_weights(tmp / "local-run", 40)
        print(f"kill -9 after the step-20 upload, output deleted, restart: resumed from the remote checkpoint "
              f"(steps {min(got)}-40 logged), final weights bitwise equal to the uninterrupted run")
        files_per_checkpoint = sum(1 for f in (out / "checkpoints/step-00000040").rglob("*") if f.is_file())

        # SIGTERM (a Spot notice): the final checkpoint is uploaded within the grace, then exit 0.
        out = tmp / "sigterm"
        args = [BIN, "--config", cfg, "-q", "--set", f"training.output_dir={out}", "--set",
                f'data.path="{tmp / "local"}"', "--set", 'checkpoint.remote="s3://moe-test/sigterm"',
                "--set", "checkpoint.remote_grace_s=60"]
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**env, **slow})
        while not (out / "metrics.jsonl").exists() or max(losses(out), default=0) < 14:
            assert p.poll() is None, p.communicate()[1][-3000:]
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        last = max(losses(out))
        assert last < 40 and srv.get("sigterm/latest").decode().strip() == f"step-{last:08d}", (last, srv.keys("sigterm/"))
        assert f"sigterm/step-{last:08d}/checksums.json" in srv.keys("sigterm/")
        print(f"SIGTERM after step {last}: its checkpoint uploaded (remote latest = step-{last:08d}) before exit 0")

        # A killed upload: the process dies after the first file of its second checkpoint.
        out = tmp / "killed"
        args = [BIN, "--config", cfg, "-q", "--set", f"training.output_dir={out}", "--set",
                f'data.path="{tmp / "local"}"', "--set", 'checkpoint.remote="s3://moe-test/killed"']
        r = subprocess.run(args, capture_output=True, text=True,
                           env={**env, **slow, "MOE_TEST_DIE_IN_UPLOAD": str(files_per_checkpoint + 1)})
        assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr[-2000:])
        keys = srv.keys("killed/")
        assert srv.get("killed/latest").decode().strip() == "step-00000010", keys
        assert "killed/step-00000020/checksums.json" not in keys and any(
            k.startswith("killed/step-00000020/") for k in keys), keys
        shutil.rmtree(out)
        r = subprocess.run(args, capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        got = losses(out)
        assert all(got[s] == want[s] for s in got) and min(got) == 11, sorted(got)
        print(f"upload killed after {files_per_checkpoint + 1} files: remote latest stayed step-00000010 "
              f"(step-00000020 partial, no checksums.json); restart resumed from step 10, bitwise")

        # A corrupted object: caught by its checksum, named.
        prepare("s3://moe-test/bad")
        victim = manifest["splits"]["train"][0]["file"]  # read first with shuffle off
        data = bytearray(srv.get(f"bad/{victim}"))
        data[len(data) // 2] ^= 0xFF
        srv.put(f"bad/{victim}", bytes(data))
        r = subprocess.run([BIN, "verify-data", "s3://moe-test/bad"], capture_output=True, text=True, env=env)
        assert r.returncode == 2 and f"s3://moe-test/bad/{victim}" in r.stderr and "md5" in r.stderr, r.stderr
        r = train(tmp / "bad-run", "s3://moe-test/bad", "data.shuffle=false", ok=False)
        assert r.returncode == 2 and f"s3://moe-test/bad/{victim}" in r.stderr and "md5" in r.stderr, r.stderr[-2000:]
        print(f"corrupted object: verify-data and training exit 2 naming s3://moe-test/bad/{victim} (md5)")

        # Wrong credentials, a missing bucket: one line, exit 2, nothing written.
        for what, sets, extra in (
                ("wrong secret key", [], {"AWS_SECRET_ACCESS_KEY": "not-the-key"}),
                ("unknown access key", [], {"AWS_ACCESS_KEY_ID": "AKIANOSUCHKEY0000000"}),
                ("missing bucket (data)", ['data.path="s3://no-such-bucket/ds"'], {}),
                ("missing bucket (checkpoint.remote)", ['checkpoint.remote="s3://no-such-bucket/ckpt"'], {})):
            out = tmp / "refused"
            args = [BIN, "--config", cfg, "-q", "--set", f"training.output_dir={out}", "--set",
                    'data.path="s3://moe-test/ds"']
            for s in sets:
                args += ["--set", s]
            r = subprocess.run(args, capture_output=True, text=True, env={**env, **extra})
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 2 and len(lines) == 1, (what, r.returncode, r.stderr[-2000:])
            assert not out.exists(), f"{what}: something was written"
            print(f"{what}: exit 2: {lines[0][:170]}")
        # A redirect (a bucket in another region) is not a success: uploads would be lost.
        srv.proxy.redirect = True
        r = subprocess.run([BIN, "prepare-data", corpus, "--out", "s3://moe-test/elsewhere"], capture_output=True,
                           text=True, env=env)
        srv.proxy.redirect = False
        assert r.returncode == 2 and "HTTP 301" in r.stderr and "AWS_REGION" in r.stderr, r.stderr[-2000:]
        assert "moe-test/elsewhere/manifest.json" not in srv.keys("elsewhere/"), "nothing uploaded"
        print(f"301 PermanentRedirect: exit 2: {r.stderr.strip().splitlines()[-1][:170]}")

        # One cache directory, two processes: the second is refused, the first trains on.
        shared = tmp / "shared-cache"
        first = subprocess.Popen([BIN, "--config", cfg, "-q", "--set", f"training.output_dir={tmp / 'share-a'}",
                                  "--set", 'data.path="s3://moe-test/ds"', "--set", f'data.cache_dir="{shared}"',
                                  "--set", "training.train_iters=200"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**env, **slow})
        while not (shared / "moe-test/ds/.lock").exists():
            assert first.poll() is None, first.communicate()[1][-2000:]
            time.sleep(0.05)
        r = train(tmp / "share-b", "s3://moe-test/ds", f'data.cache_dir="{shared}"', ok=False)
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=300)
        assert first.returncode == 0, err[-2000:]
        assert r.returncode == 2 and "in use by another moe-train process" in r.stderr, r.stderr[-2000:]
        print("a second run on the same data.cache_dir: exit 2 (in use by another process); the first unharmed")
    finally:
        srv.close()
