#!/usr/bin/env python3
"""The rooms of src/ include each other without a cycle, and headers sit beside their sources.

Reads the `#include "moe/<folder>/..."` lines of src/<folder>/* and include/moe/<folder>/*,
builds the graph of folders (an edge A -> B when a file of A includes a header of B), and fails
naming every cycle (the strongly connected components of more than one folder, with one file
and line per edge, so that the fix is a look away). Also: every src/X/Y.cpp whose stem has a
header anywhere in include/moe/ has it as include/moe/X/Y.h (a header implemented in a file of
another name or room is what issue 46 found: hf_checkpoint.cpp implementing train/init_from).

usage: include_graph_test.py [REPO_ROOT]      exit 0 when clean, 1 naming what is wrong
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
INCLUDE = re.compile(r'^\s*#\s*include\s+"moe/([a-z_0-9]+)/([^"]+)"', re.M)
SOURCES = (".cpp", ".h", ".cu", ".cuh")


def folder_of(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[2] if rel.parts[0] == "include" else rel.parts[1]


def edges():
    """(from folder, to folder) -> first (file, line) that makes the edge."""
    found = {}
    files = [p for p in (ROOT / "src").rglob("*") if p.suffix in SOURCES]
    files += [p for p in (ROOT / "include/moe").rglob("*") if p.suffix in SOURCES]
    for path in sorted(files):
        src = folder_of(path)
        text = path.read_text(encoding="utf-8")
        for m in INCLUDE.finditer(text):
            dst = m.group(1)
            if dst != src and (src, dst) not in found:
                line = text.count("\n", 0, m.start()) + 1
                found[(src, dst)] = f"{path.relative_to(ROOT)}:{line}"
    return found


def cycles(graph):
    """Tarjan's strongly connected components with more than one node."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def misplaced_sources():
    headers = {}
    for h in (ROOT / "include/moe").rglob("*.h"):
        headers.setdefault(h.stem, []).append(h.relative_to(ROOT))
    bad = []
    for cpp in sorted((ROOT / "src").rglob("*.cpp")):
        rel = cpp.relative_to(ROOT)
        owners = headers.get(cpp.stem, [])
        want = pathlib.Path("include/moe") / rel.parts[1] / (cpp.stem + ".h")
        if owners and want not in owners:
            bad.append(f"{rel}: its header is {', '.join(map(str, owners))}, expected {want}")
    return bad


def main():
    found = edges()
    graph = {}
    for a, b in found:
        graph.setdefault(a, set()).add(b)
    problems = []
    for comp in cycles(graph):
        members = set(comp)
        via = [f"{a} -> {b} ({found[(a, b)]})" for (a, b) in sorted(found) if a in members and b in members]
        problems.append("include cycle between " + ", ".join(comp) + ": " + "; ".join(via))
    problems += misplaced_sources()
    for p in problems:
        print(f"FAIL {p}")
    if problems:
        return 1
    print(f"ok   {len(graph)} folders, {len(found)} edges between folders, no cycle; "
          "every source beside its header")
    return 0


if __name__ == "__main__":
    sys.exit(main())
