"""The documentation against the tree it describes (issue 46, part 6). Three checks:

  links    every relative markdown link [text](path) in a markdown file of the repository (README,
           docs/, bench/, configs/, ...) names an existing file or directory (the #anchor is not
           checked; http(s) and mailto links are skipped), and every mention of docs/<name>.md in
           README.md, docs/, src/, include/, configs/, scripts/, bench/, tests/ and cmake/ (code
           and comments too: key descriptions, error hints) names an existing document;
  map      docs/architecture.md names every file under src/, by its path relative to src/ (with
           or without "src/") or by its file name;
  recipes  the ```sh / ```bash / ```python blocks of docs/finetune.md run as written, in document
           order, in one scratch directory, on a tiny model built here (nothing is downloaded):
           a Qwen3-MoE from tests/hf/tiny_families.py, a Qwen3-style byte-level BPE tokenizer
           trained with `tokenizers`, Qwen3's chat template (tests/chat/chat_templates/qwen3.jinja),
           and a small instruction file. A block preceded by `<!-- docs-check: skip (REASON) -->`
           is skipped and reported; an unlabelled block holding a `moe-train` command fails (label
           it or mark it).

What the recipe check changes in the blocks, and nothing else:

  - PLACEHOLDERS: the names docs/finetune.md itself calls yours, replaced textually;
  - OVERRIDES: options appended to a command whose text starts with the key, to keep the run
    tiny (a 2-step run of 32-token windows instead of 1000 steps of 2048);
  - the scratch directory stands for the repository root: it holds a copy of configs/, and
    `sft.jsonl` (the doc's name for your instruction data) written by the fixture;
  - `moe-train` on PATH is MOE_TRAIN_BIN; python blocks run with this interpreter; HF_HUB_OFFLINE
    and TRANSFORMERS_OFFLINE are set, so transformers reads local directories only.

After the blocks: data/sft/manifest.json, if the recipe wrote it, holds a loss mask that trains
fewer tokens than it holds (the recipe's point: the prompts are not trained).

Each failure is one line naming the file, the link or command, and what is missing; exit 1 on any
failure, 0 with a summary otherwise, 77 (ctest SKIP) without transformers or tokenizers.

usage: docs_check_test.py MOE_TRAIN_BIN SOURCE_DIR
"""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse

BIN = pathlib.Path(sys.argv[1]).resolve()
ROOT = pathlib.Path(sys.argv[2]).resolve()
RECIPE_DOC = "docs/finetune.md"

# The names docs/finetune.md says are the user's: doc text -> what it becomes here ({hf_model} is
# the tiny Hugging Face model directory built by make_fixture).
PLACEHOLDERS = {"/models/Qwen3-30B-A3B": "{hf_model}"}
# Options appended to the command that starts with the key (after placeholders).
OVERRIDES = {
    "moe-train --config configs/finetune-lora.json":
        "--set training.train_iters=2 --set model.seq_len=32",
}
RUN_LANGS = {"sh", "bash", "shell", "python"}
SKIP_MARK = re.compile(r"<!--\s*docs-check:\s*skip\s*(?:\((.*?)\))?\s*-->")
SCAN_DIRS = ["docs", "src", "include", "configs", "scripts", "bench", "tests", "cmake"]
SKIP_DIRS = {".git", "__pycache__", "node_modules"}

failures = []


def fail(msg):
    failures.append(msg)
    print(f"FAIL: {msg}", flush=True)


def rel(p):
    return pathlib.Path(p).resolve().relative_to(ROOT).as_posix()


def walk(top):
    """Regular files under top, outside .git and build trees (a directory with CMakeCache.txt)."""
    for dirpath, dirnames, filenames in os.walk(top):
        if (pathlib.Path(dirpath) / "CMakeCache.txt").exists():
            dirnames[:] = []
            continue
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("build"))
        for f in sorted(filenames):
            yield pathlib.Path(dirpath) / f


def read_text(p):
    try:
        if p.stat().st_size > 4 << 20:
            return None
        return p.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


# ---------------------------------------------------------------------------------------- links
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"`+[^`]*`+")
DOC_MENTION = re.compile(r"(?<![\w./-])docs/([\w.-]+?\.md)(?![\w-])")


def check_links():
    files = [ROOT / "README.md"] + [f for d in SCAN_DIRS if (ROOT / d).is_dir() for f in walk(ROOT / d)]
    links = mentions = 0
    for f in files:
        text = read_text(f)
        if text is None:
            continue
        in_fence = False
        for n, line in enumerate(text.splitlines(), 1):
            if f.suffix == ".md":
                if line.lstrip().startswith("```"):
                    in_fence = not in_fence
                elif not in_fence:
                    for m in LINK.finditer(CODE_SPAN.sub("", line)):
                        target = m.group(1)
                        if re.match(r"[A-Za-z][\w+.-]*:", target) or target.startswith("#"):
                            continue
                        path = urllib.parse.unquote(target.split("#", 1)[0])
                        links += 1
                        resolved = (ROOT / path.lstrip("/")) if path.startswith("/") else f.parent / path
                        if not resolved.exists():
                            fail(f"{rel(f)}:{n}: link ({target}): {rel_or_abs(resolved)} does not exist")
            for m in DOC_MENTION.finditer(line):
                mentions += 1
                if not (ROOT / "docs" / m.group(1)).is_file():
                    fail(f"{rel(f)}:{n}: mentions {m.group(0)}, which does not exist")
    print(f"links: {links} relative links and {mentions} docs/*.md mentions in {len(files)} files")


def rel_or_abs(p):
    try:
        return rel(p)
    except ValueError:
        return str(p)


# ------------------------------------------------------------------------------------------ map
def check_architecture_map():
    arch = (ROOT / "docs/architecture.md").read_text(encoding="utf-8")
    files = [f for f in walk(ROOT / "src")]
    # The family files are found by the build (src/CMakeLists.txt's glob) and listed by
    # `moe-train families` (docs/hf.md's table): the map names their pattern, so a new family
    # touches its own file, its test and its published config only (issue 63).
    family_glob = "src/families/*_family.cpp" in arch
    for f in files:
        r = f.relative_to(ROOT / "src").as_posix()
        if family_glob and re.fullmatch(r"families/\w+_family\.cpp", r):
            continue
        by_path = r"(?<![\w./-])(?:src/)?" + re.escape(r) + r"(?![\w-])"
        by_name = r"(?<![\w./-])" + re.escape(f.name) + r"(?![\w-])"
        if not (re.search(by_path, arch) or re.search(by_name, arch)):
            fail(f"docs/architecture.md: does not name src/{r} (add it, with one line on what it holds)")
    print(f"map: docs/architecture.md checked against {len(files)} files of src/")


# -------------------------------------------------------------------------------------- recipes
def blocks(path):
    """Fenced blocks of a markdown file: (first line of the body, language, body lines, skip
    reason or None)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"\s*```\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1).lower(), i + 1
        j = start
        while j < len(lines) and not re.match(r"\s*```\s*$", lines[j]):
            j += 1
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        mark = SKIP_MARK.search(lines[k]) if k >= 0 else None
        skip = (mark.group(1) or "marked skip") if mark else None
        out.append((start + 1, lang, lines[start:j], skip))
        i = j + 1
    return out


def logical_commands(body):
    """Shell lines joined at trailing backslashes: (index of the first line, index of the last
    line, text)."""
    cmds, i = [], 0
    while i < len(body):
        first, text = i, body[i].rstrip()
        while text.endswith("\\") and i + 1 < len(body):
            i += 1
            text = text[:-1].rstrip() + " " + body[i].strip()
        cmds.append((first, i, text.strip()))
        i += 1
    return cmds


def tokenizer_and_model(out):
    """A tiny Qwen3-MoE directory as the Hub ships one: config.json, model.safetensors,
    tokenizer.json (NFC + byte-level BPE, <|endoftext|> <|im_start|> <|im_end|> special) and
    tokenizer_config.json with Qwen3's chat template and <|im_end|> as EOS."""
    import random
    import torch
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    sys.path.insert(0, str(ROOT / "tests" / "hf"))
    from tiny_families import COMMON, FAMILIES

    rnd = random.Random(46)
    words = ("the of and to in is that it for was on are as with what how why weather Paris "
             "tomorrow answer question please explain step model data train café 42").split()

    def sentence(n):
        return " ".join(rnd.choice(words) for _ in range(n)) + rnd.choice([".", "?", "!"])

    out.mkdir(parents=True)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator([sentence(20) for _ in range(500)], trainers.BpeTrainer(
        vocab_size=300, special_tokens=special, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(out / "tokenizer.json"))
    assert tok.get_vocab_size() <= COMMON["vocab_size"]
    template = (ROOT / "tests/chat/chat_templates/qwen3.jinja").read_text(encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20,
        "chat_template": template, "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>"}))
    cls, extra = FAMILIES["qwen3_moe"]
    config = cls(**dict(COMMON, bos_token_id=None, eos_token_id=tok.token_to_id("<|im_end|>"),
                        pad_token_id=tok.token_to_id("<|endoftext|>")), **extra)
    torch.manual_seed(46)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(out)

    examples = []
    for i in range(48):
        chat = [{"role": "user", "content": sentence(rnd.randint(4, 10))},
                {"role": "assistant", "content": sentence(rnd.randint(6, 14))}]
        if i % 4 == 1:
            chat.insert(0, {"role": "system", "content": sentence(5)})
        if i % 6 == 5:
            examples.append({"conversations": [{"from": {"user": "human", "assistant": "gpt"}.get(
                m["role"], m["role"]), "value": m["content"]} for m in chat]})
        elif i % 6 == 3:
            examples.append({"prompt": chat[-2]["content"], "completion": chat[-1]["content"]})
        else:
            examples.append({"messages": chat})
    return "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in examples)


def last_line(text):
    lines = [l for l in text.splitlines() if l.strip()]
    return lines[-1].strip() if lines else "(no output)"


def check_recipes(tmp):
    doc = ROOT / RECIPE_DOC
    text = doc.read_text(encoding="utf-8")
    for key in list(PLACEHOLDERS) + list(OVERRIDES):
        if key not in text:
            fail(f"{RECIPE_DOC}: the test's mapping names '{key}', which the document no longer has "
                 f"(update PLACEHOLDERS / OVERRIDES in tests/docs/docs_check_test.py)")

    t0 = time.monotonic()
    hf_model = tmp / "hf" / "Qwen3-30B-A3B"
    sft = tokenizer_and_model(hf_model)
    values = {"hf_model": str(hf_model)}
    work = tmp / "repo"
    work.mkdir()
    shutil.copytree(ROOT / "configs", work / "configs")
    (work / "sft.jsonl").write_text(sft, encoding="utf-8")
    bindir = tmp / "bin"
    bindir.mkdir()
    (bindir / "moe-train").symlink_to(BIN)
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    print(f"recipes: fixture (tiny Qwen3-MoE, tokenizer, {len(sft.splitlines())} examples) in "
          f"{time.monotonic() - t0:.1f} s")

    for line0, lang, body, skip in blocks(doc):
        if skip is None and lang not in RUN_LANGS and any(l.strip().startswith("moe-train ") for l in body):
            fail(f"{RECIPE_DOC}:{line0}: a block of moe-train commands without a sh/bash label: label "
                 f"it ```sh, or mark it <!-- docs-check: skip (REASON) -->")

    ran = skipped = 0
    for line0, lang, body, skip in blocks(doc):
        where = f"{RECIPE_DOC}:{line0}"
        if lang not in RUN_LANGS:
            continue
        if skip is not None:
            print(f"recipes: skipped the {lang} block at {where} ({skip})")
            skipped += 1
            continue
        shown, body = list(body), list(body)  # as written, and as run
        for key, value in PLACEHOLDERS.items():
            body = [l.replace(key, value.format(**values)) for l in body]
        t = time.monotonic()
        if lang == "python":
            script = tmp / f"block-{line0}.py"
            script.write_text("\n".join(body) + "\n", encoding="utf-8")
            r = subprocess.run([sys.executable, str(script)], cwd=work, env=env,
                               capture_output=True, text=True)
            if r.returncode != 0:
                lines = re.findall(rf'File "{re.escape(str(script))}", line (\d+)', r.stderr)
                n = int(lines[-1]) - 1 if lines else 0
                fail(f"{RECIPE_DOC}:{line0 + n}: `{shown[n].strip()}`: exit {r.returncode}: "
                     f"{last_line(r.stderr)}")
                break
        else:
            status = tmp / f"block-{line0}.status"
            script = ["set -eo pipefail",
                      f"trap 'echo $__docs_line > {status}' EXIT"]
            cmds = logical_commands(body)
            for first, last, cmd in cmds:
                lines = body[first:last + 1]
                if cmd and not cmd.startswith("#"):
                    for key, extra in OVERRIDES.items():
                        if cmd == key or cmd.startswith(key + " "):
                            lines[-1] = lines[-1] + " " + extra
                    script.append(f"__docs_line={first}")
                script.extend(lines)
            script.append("__docs_line=-1")
            r = subprocess.run(["bash", "-c", "\n".join(script)], cwd=work, env=env,
                               capture_output=True, text=True)
            if r.returncode != 0:
                at = status.read_text().strip() if status.exists() else ""
                n = int(at) if at.lstrip("-").isdigit() and int(at) >= 0 else 0
                cmd = next((c for f_, _, c in logical_commands(shown) if f_ == n), shown[n].strip())
                fail(f"{RECIPE_DOC}:{line0 + n}: `{cmd}`: exit {r.returncode}: "
                     f"{last_line(r.stderr or r.stdout)}")
                break
        ran += 1
        print(f"recipes: the {lang} block at {where} ran ({time.monotonic() - t:.1f} s)")

    manifest = work / "data" / "sft" / "manifest.json"
    if manifest.exists():
        m = json.loads(manifest.read_text())
        total = sum(s["tokens"] for split in m["splits"].values() for s in split)
        if not m.get("loss_mask") or not 0 < m.get("target_tokens", 0) < total:
            fail(f"{RECIPE_DOC}: the recipe's data/sft has no loss mask that leaves the prompts out "
                 f"(loss_mask {m.get('loss_mask')}, target_tokens {m.get('target_tokens')} of "
                 f"{total} tokens): use prepare-data --format sft")
        else:
            print(f"recipes: data/sft trains {m['target_tokens']} of {total} tokens (the answers)")
    print(f"recipes: {ran} blocks ran, {skipped} skipped, {time.monotonic() - t0:.1f} s")


def main():
    try:
        import tokenizers  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"{e.name} not installed: skipping")
        sys.exit(77)
    t0 = time.monotonic()
    check_links()
    check_architecture_map()
    with tempfile.TemporaryDirectory(prefix="docs-check-") as tmp:
        check_recipes(pathlib.Path(tmp))
    if failures:
        print(f"{len(failures)} failure(s)")
        sys.exit(1)
    print(f"docs check passed in {time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    main()
