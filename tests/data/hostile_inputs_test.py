"""Hostile inputs from the hub (issue 51): chat templates and tokenizer.json files that once
crashed, hung or took gigabytes stop at the sandbox's budgets with exit 2 and one line naming the
file and the limit, in bounded memory (peak RSS of the process, from wait4; under 1 GiB).
  1. an expression nested 200,000 parentheses deep (was SIGSEGV: stack overflow);
  2. {% for i in range(1000000000) %} (was 17.6 GB after 60 s; Jinja2's sandbox caps range);
  3. a string doubled 40 times (was 24 GB after 60 s);
  4. 100,000 nested {% if %} blocks (was still parsing after 60 s);
  5. a tokenizer.json whose Split regex backtracks catastrophically (was exit 1, naming nothing).
Each message ends with the `moe-train --limit NAME=N` that raises its budget; --limit raises and
lowers them, and refuses unknown names and values out of range.
The elapsed time of each is printed, not asserted (a hang would hit ctest's timeout).
usage: hostile_inputs_test.py MOE_TRAIN_BINARY
"""
import json
import os
import pathlib
import select
import subprocess
import sys
import tempfile
import time

from tokenizers import Tokenizer, models, pre_tokenizers, trainers, Regex

BIN = sys.argv[1]
MAX_RSS_KB = 1 << 20  # 1 GiB


def run(args):
    t0 = time.time()
    p = subprocess.Popen([BIN, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=300)
    return p.returncode, out, err, time.time() - t0


def run_measured(args):
    """Exit code, stderr, seconds and peak RSS (KiB) of one moe-train process (wait4's rusage)."""
    t0 = time.time()
    p = subprocess.Popen([BIN, *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = b""
    deadline = t0 + 300
    while True:
        r, _, _ = select.select([p.stderr], [], [], 1.0)
        if r:
            chunk = os.read(p.stderr.fileno(), 65536)
            if not chunk:
                break
            err += chunk
        if time.time() > deadline:
            p.kill()
            break
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, err.decode(errors="replace"), time.time() - t0, usage.ru_maxrss


failures = []


def check(name, args, file_name, limit_words):
    rc, err, secs, rss = run_measured(args)
    lines = [l for l in err.splitlines() if l.strip()]
    line = lines[-1] if lines else ""
    ok = rc == 2 and len(lines) == 1 and file_name in line and all(w in line for w in limit_words) \
        and rss < MAX_RSS_KB
    print(f"{'ok  ' if ok else 'FAIL'} {name}: exit {rc}, {secs:.2f} s, peak RSS {rss / 1024:.0f} MiB: {line}")
    if not ok:
        failures.append(name)
        print(err[-3000:])


with tempfile.TemporaryDirectory() as d:
    tmp = pathlib.Path(d)
    # A small byte-level tokenizer directory, trained here (nothing downloaded).
    corpus = [f"user asks question {i} and assistant answers with words {i * 7}" for i in range(500)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model = tmp / "model"
    model.mkdir()
    tok.save(str(model / "tokenizer.json"))
    (model / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
        "chat_template": "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"}))
    chat = tmp / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "hello"}]}) + "\n")

    templates = {
        "parentheses 200,000 deep": ("{{ " + "(" * 200000 + "1" + ")" * 200000 + " }}",
                                     ["nested more than 200 levels", "--limit template.nesting=N"]),
        "range(1000000000)": ("{% for i in range(1000000000) %}{{ i }}{% endfor %}",
                              ["range()", "100000", "--limit template.range_items=N"]),
        "a string doubled 40 times": ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}"
                                      "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
                                      ["64 MiB", "--limit template.text_mib=N"]),
        "100,000 nested ifs": ("{% if true %}\n" * 100000, ["blocks nested more than 200 levels",
                                                        "--limit template.nesting=N"]),
    }
    for i, (name, (text, words)) in enumerate(templates.items()):
        t = tmp / f"hostile-{i}.jinja"
        t.write_text(text)
        out = tmp / f"out-{i}"
        check(name, ["prepare-data", chat, "--out", out, "--format", "sft", "--tokenizer-from", model,
                     "--chat-template", t], t.name, words)
        assert not out.exists(), f"{name}: {out} was written"

    # A Split regex that backtracks exponentially on a run of 'a's without a match at the end.
    j = json.loads(tok.to_str())
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(a|aa)+$"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    evil = tmp / "evil"
    evil.mkdir()
    (evil / "tokenizer.json").write_text(json.dumps(j))
    text = tmp / "text.jsonl"
    text.write_text(json.dumps({"text": "a" * 64 + "b"}) + "\n")
    out = tmp / "out-regex"
    check("catastrophic Split regex", ["prepare-data", text, "--out", out, "--tokenizer", "hf",
                                       "--tokenizer-file", evil / "tokenizer.json"],
          "tokenizer.json", ["(a|aa)+$", "limit", "--limit regex.match_steps=N"])
    assert not out.exists(), f"{out} was written"

    # Real templates still render (the families' templates are checked against transformers by
    # tests/chat/sft_data_test.py; here: the sandbox does not refuse an ordinary run).
    rc, _, err, _ = run(["prepare-data", chat, "--out", tmp / "ok", "--format", "sft", "--tokenizer-from", model])
    assert rc == 0, err

    # The budgets are raised (or lowered) from the command line: --limit NAME=N.
    wide = tmp / "wide-range.jinja"
    wide.write_text("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                    "{% for i in range(150000) %}{% endfor %}")
    sft = ["prepare-data", chat, "--format", "sft", "--tokenizer-from", model, "--chat-template", wide]
    rc, _, err, _ = run([*sft, "--out", tmp / "wide-default"])
    if not (rc == 2 and "--limit template.range_items=N" in err):
        failures.append("range(150000) under the default budget")
        print(f"FAIL range(150000) under the default budget: exit {rc} {err[-400:]}")
    rc, _, err, _ = run(["--limit", "template.range_items=200000", *sft, "--out", tmp / "wide-raised"])
    if rc != 0:
        failures.append("--limit template.range_items=200000")
        print(f"FAIL --limit template.range_items=200000: exit {rc} {err[-400:]}")
    rc, _, err, _ = run(["--limit", "template.nesting=1", "prepare-data", chat, "--out", tmp / "narrow",
                         "--format", "sft", "--tokenizer-from", model, "--chat-template",
                         tmp / "hostile-0.jinja"])
    lowered = rc == 2 and "nested more than 1 levels" in err
    for bad, words in ((["--limit", "template.bogus=3"], ["template.bogus", "template.range_items", "json.nesting"]),
                       (["--limit", "template.nesting=100000"], ["template.nesting", "from 1 to 1000"]),
                       (["--limit", "regex.depth=-1"], ["regex.depth", "not an integer"])):
        rc, _, err, _ = run([*bad, "prepare-data", chat, "--out", tmp / "never", "--format", "sft",
                             "--tokenizer-from", model])
        lines = [l for l in err.splitlines() if l.strip()]
        if not (rc == 2 and len(lines) == 1 and all(w in lines[0] for w in words)):
            failures.append(f"{bad} refused")
            print(f"FAIL {bad}: exit {rc} {err[-400:]}")
    if not lowered:
        failures.append("--limit template.nesting=1")
    print(f"{'ok  ' if not failures else 'FAIL'} --limit raises and lowers budgets, refuses bad ones")

if failures:
    print(f"0 passed, {len(failures)} failed: {failures}")
    sys.exit(1)
print("6 passed, 0 failed")
