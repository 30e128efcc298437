"""Table-driven run of the bad-input corpus (cases.json, made by make_corpus.py): configs, shards,
dataset manifests and checkpoints that are malformed in every way we could think of. Each must
exit with its documented code (2), print exactly one `moe-train:` line that names the file and
the problem, crash nowhere, and leave the output directory untouched.
Usage: corpus_test.py MOE_TRAIN_BIN"""
import hashlib
import json
import pathlib
import subprocess
import sys
import tempfile

BIN = sys.argv[1]
HERE = pathlib.Path(__file__).resolve().parent
cases = json.loads((HERE / "cases.json").read_text())
base = (HERE / "base.json").read_text()
failures = []


def snapshot(d):
    return {str(p.relative_to(d)): hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()}


with tempfile.TemporaryDirectory() as t:
    t = pathlib.Path(t)
    out = t / "out"
    (out / "checkpoints").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"type":"train","step":1,"loss":1.0}\n')
    (out / "config.json").write_text("{}\n")
    before = snapshot(out)
    fill = lambda text: text.replace("@GOOD_SHARD@", str(HERE / "shards/good.h5")).replace("@OUT@", str(out))
    for i, case in enumerate(cases):
        target = HERE / case["file"]
        extra = []
        if case["kind"] == "config":
            cfg = t / f"case{i}-{target.name}"
            cfg.write_bytes(fill(target.read_bytes().decode("latin-1")).encode("latin-1"))
            name = cfg.name
        else:
            c = json.loads(fill(base))
            if case["kind"] == "shard":
                c["data"]["train_path"] = str(target)
            elif case["kind"] == "dataset":
                c["data"] = {"path": str(target), "verify_checksums": case.get("verify", False)}
            else:
                extra = ["--resume", str(target)]
            cfg = t / f"case{i}.json"
            cfg.write_text(json.dumps(c))
            name = target.name
        r = subprocess.run([BIN, "--config", str(cfg), *extra], capture_output=True, text=True,
                           errors="replace", timeout=120)
        lines = [l for l in r.stderr.splitlines() if l.startswith("moe-train:")]
        problems = []
        if r.returncode != case["exit"]:
            problems.append(f"exit {r.returncode}, expected {case['exit']}")
        if len(lines) != 1:
            problems.append(f"{len(lines)} error lines")
        elif case["needle"] not in lines[0] or name not in lines[0]:
            problems.append(f"line lacks '{case['needle']}' or '{name}'")
        for bad in ["Traceback", "terminate called", "Sanitizer", "core dumped", "Segmentation"]:
            if bad in r.stderr:
                problems.append(f"stderr has '{bad}'")
        if snapshot(out) != before:
            problems.append("output directory modified")
        status = "FAIL" if problems else "ok  "
        print(f"{status} {case['kind']:10s} {case['file']:45s} {('; '.join(problems) + ' | ') if problems else ''}{lines[0] if lines else r.stderr.strip()[-200:]}")
        if problems:
            failures.append(case["file"])

print(f"{len(cases) - len(failures)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
