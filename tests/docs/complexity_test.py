#!/usr/bin/env python3
"""Every function in src/ is short and simple, and every file of src/ is under 800 lines.

Runs lizard (https://github.com/terryyin/lizard) over the C++ and CUDA sources of src/ (.cpp, .h,
.cu, .cuh; lizard reads the CUDA files with its C/C++ reader) and fails naming file:line,
function, length and cyclomatic complexity (CCN) of every function longer than 100 lines or
with a CCN of 30 or more. Also fails naming every source file of src/ longer than 800 lines.
The gate of issue 63: a function that grows past it is split (table-driven where it helps)
rather than the limit raised.

usage: complexity_test.py [REPO_ROOT]      exit 0 when clean, 1 naming every offender,
                                           77 (skipped) when lizard is not importable
"""
import pathlib
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
SOURCES = (".cpp", ".h", ".cu", ".cuh")
MAX_FUNCTION_LINES = 100  # a function of more lines fails
MAX_CCN = 29  # a function of a higher cyclomatic complexity (30 or more) fails
MAX_FILE_LINES = 800  # a file of more lines fails


def sources():
    return sorted(p for p in (ROOT / "src").rglob("*") if p.is_file() and p.suffix in SOURCES)


def long_files(files):
    bad = []
    for path in files:
        lines = path.read_text(encoding="utf-8").count("\n")
        if lines > MAX_FILE_LINES:
            bad.append(f"{path.relative_to(ROOT)}: {lines} lines (at most {MAX_FILE_LINES})")
    return bad


def complex_functions(lizard, files):
    bad, count = [], 0
    for path in files:
        # lizard picks its reader by extension and falls back to the C/C++ one for .cu/.cuh.
        info = lizard.analyze_file(str(path))
        for fn in info.function_list:
            count += 1
            too_long = fn.length > MAX_FUNCTION_LINES
            too_complex = fn.cyclomatic_complexity > MAX_CCN
            if too_long or too_complex:
                why = []
                if too_long:
                    why.append(f"over {MAX_FUNCTION_LINES} lines")
                if too_complex:
                    why.append(f"CCN {MAX_CCN + 1} or more")
                bad.append(f"{path.relative_to(ROOT)}:{fn.start_line}: {fn.name}: {fn.length} lines, "
                           f"CCN {fn.cyclomatic_complexity} ({', '.join(why)})")
    return bad, count


def main():
    try:
        import lizard  # pylint: disable=import-outside-toplevel
    except ImportError:
        print("skip lizard is not importable (scripts/setup installs it into the venv)")
        return 77
    files = sources()
    if not files:
        print(f"FAIL no C++ or CUDA sources under {ROOT / 'src'}")
        return 1
    functions, count = complex_functions(lizard, files)
    problems = functions + long_files(files)
    for p in problems:
        print(f"FAIL {p}")
    if problems:
        return 1
    print(f"ok   {len(files)} files, {count} functions: none over {MAX_FUNCTION_LINES} lines or at CCN "
          f"{MAX_CCN + 1}+, no file over {MAX_FILE_LINES} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
