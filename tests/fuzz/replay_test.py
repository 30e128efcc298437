"""Every fuzz seed and every input that once failed, replayed through its target on each CI build
(issue 51: findings kept as regression seeds in CI). fuzz/assemble_seeds writes the seed corpora
scripts/fuzz starts from; each target's fuzz_replay_<target> (the libFuzzer target's
LLVMFuzzerTestOneInput linked with tests/fuzz/replay_main.cpp, GCC, no sanitizers) runs them all:
a crash, a trap (an invariant the target checks) or an exception other than the user error the
target expects fails the test. Left out: data-hdf5-attr-heap-overflow.bin, the heap overflow
inside libhdf5 1.10.8's own attribute decoding (docs/reliability.md): without ASan it corrupts
the heap silently or not at all, so replaying it proves nothing.
usage: replay_test.py SOURCE_DIR REPLAY_DIR"""
import pathlib
import subprocess
import sys
import tempfile

SRC, REPLAY = pathlib.Path(sys.argv[1]).resolve(), pathlib.Path(sys.argv[2]).resolve()
TARGETS = ["config", "data", "safetensors", "chat_template", "sft", "tokenizer", "hf_config", "hf_index",
           "manifest", "s3", "adapter_config"]
SKIP = {"data": ["data-hdf5-attr-heap-overflow.bin"]}
failed = []
with tempfile.TemporaryDirectory() as d:
    seeds = pathlib.Path(d) / "seeds"
    subprocess.run([str(SRC / "fuzz/assemble_seeds"), str(seeds)], check=True, cwd=SRC)
    regressions = {p.name for p in (SRC / "tests/corpus/fuzz-regressions").iterdir()}
    for t in TARGETS:
        args = [str(REPLAY / f"fuzz_replay_{t}")]
        for name in SKIP.get(t, []):
            args += ["--skip", name]
        files = sorted((seeds / t).iterdir())
        r = subprocess.run(args + [str(seeds / t)], capture_output=True, text=True, timeout=600, cwd=d)
        replayed = [l for l in r.stdout.splitlines() if l.startswith("replaying ")]
        ours = sum(1 for f in files if f.name in regressions)
        ok = r.returncode == 0 and len(replayed) == len(files) - len(SKIP.get(t, []))
        print(f"{'ok  ' if ok else 'FAIL'} {t}: {len(replayed)} of {len(files)} inputs "
              f"({ours} once-failing) replayed, exit {r.returncode}")
        if not ok:
            failed.append(t)
            print((r.stdout + r.stderr)[-2000:])
if failed:
    print(f"failed: {failed}")
    sys.exit(1)
print(f"{len(TARGETS)} targets, every seed replayed")
