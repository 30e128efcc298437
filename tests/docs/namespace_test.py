#!/usr/bin/env python3
"""Namespaces match folders (issue 63): the code of src/<folder>/ and include/moe/<folder>/ lives in
`moe::<folder>` or a namespace inside it.

The exceptions are named here, each with its reason: util is the root `moe` (errors, safetensors,
hashing, host memory) and `moe::s3`. A block of another namespace may hold forward declarations
only (`class X;` / `struct X;`), the way a header names a type of another room without including it.

usage: namespace_test.py [REPO_ROOT]      exit 0 when clean, 1 naming each file and line
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
SOURCES = (".cpp", ".h", ".cu", ".cuh")
OPEN = re.compile(r"^namespace (moe(?:::[a-z_0-9]+)*) \{", re.M)
FORWARD = re.compile(r"^\s*(class|struct) \w+;\s*(//.*)?$")
EXTRA = {"util": ("moe", "moe::s3")}


def allowed(folder: str, ns: str) -> bool:
    own = f"moe::{folder}"
    return ns == own or ns.startswith(own + "::") or ns in EXTRA.get(folder, ())


def block_lines(text: str, start: int) -> list:
    """The lines of the block opened at `start`, up to the first `}` in column 0 (its end, as
    clang-format writes namespaces: no indentation inside)."""
    lines = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("}"):
            break
        lines.append(line)
    return lines


def problems():
    found = []
    for top, depth in (("src", 1), ("include/moe", 2)):
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in SOURCES:
                continue
            rel = path.relative_to(ROOT)
            folder = rel.parts[depth]
            text = path.read_text(encoding="utf-8")
            for m in OPEN.finditer(text):
                ns = m.group(1)
                if allowed(folder, ns):
                    continue
                body = [l for l in block_lines(text, m.start()) if l.strip() and not l.strip().startswith("//")]
                if all(FORWARD.match(l) for l in body):
                    continue
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"{rel}:{line}: namespace {ns} in folder {folder} (expected moe::{folder})")
    return found


def main() -> int:
    bad = problems()
    for b in bad:
        print(b)
    if bad:
        print(f"{len(bad)} namespace(s) do not match their folder")
        return 1
    print("every folder's code is in its own namespace")
    return 0


if __name__ == "__main__":
    sys.exit(main())
