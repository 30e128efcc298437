#!/usr/bin/env python3
"""README.md's Layout section describes every top-level folder of src/, and only those.

Reads the `## Layout` section of README.md (up to the next `## ` heading). A folder is described
by a line of that section that starts with `src/NAME/` (in a code block, or as a table cell or
list item: a leading `|`, `-`, `*` or backquote is allowed) followed by its description on the
same line. Fails naming every folder of src/ that no such line describes, every `src/NAME/` the
section mentions that is not a folder of src/, and every folder described twice (issue 63: the
Layout section matches the tree).

usage: readme_layout_test.py [REPO_ROOT]      exit 0 when they match, 1 naming each difference
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
DESCRIBED = re.compile(r"^[\s|*`-]*src/([A-Za-z0-9_.-]+)/`?[\s|:`-]*(\S.*)?$")
MENTIONED = re.compile(r"(?<![A-Za-z0-9_/.-])src/([A-Za-z0-9_.-]+)/")


def layout_section(readme: str):
    """The lines of the `## Layout` section, or None when the README has none."""
    lines = readme.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == "## Layout":
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("## ")), len(lines))
            return lines[i + 1:end]
    return None


def main():
    readme = ROOT / "README.md"
    section = layout_section(readme.read_text(encoding="utf-8"))
    if section is None:
        print(f"FAIL {readme.relative_to(ROOT)} has no '## Layout' section")
        return 1
    folders = sorted(p.name for p in (ROOT / "src").iterdir() if p.is_dir())
    described, mentioned, problems = {}, set(), []
    for line in section:
        mentioned.update(MENTIONED.findall(line))
        m = DESCRIBED.match(line)
        if not m:
            continue
        name, text = m.group(1), m.group(2)
        if not text:
            problems.append(f"README.md, Layout: src/{name}/ has no description on its line")
        elif name in described:
            problems.append(f"README.md, Layout: src/{name}/ is described twice")
        described.setdefault(name, line.strip())
    for name in folders:
        if name not in described:
            problems.append(f"src/{name}/ is not described in README.md's Layout section "
                            f"(add a line 'src/{name}/   what it holds')")
    for name in sorted(mentioned - set(folders)):
        problems.append(f"README.md's Layout section names src/{name}/, which is not a folder of src/")
    for p in problems:
        print(f"FAIL {p}")
    if problems:
        return 1
    print(f"ok   README.md's Layout section describes the {len(folders)} folders of src/, one line each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
