"""Shared scaffolding of the Python end-to-end tests that drive the moe-train binary."""
import subprocess


class Checks:
    """Prints one ok/FAIL line per check and turns the failures into the exit code."""

    def __init__(self):
        self.failures = []

    def __call__(self, cond, what):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        if not cond:
            self.failures.append(what)

    def exit_code(self):
        return 1 if self.failures else 0


def make_synthetic(binary, out, vocab, programs, doc_len, train_docs, valid_docs):
    """The demo's permutation-programs corpus (train.h5, valid.h5) in `out`."""
    subprocess.run([binary, "make-synthetic", "--out", out, "--vocab", str(vocab), "--programs", str(programs),
                    "--doc-len", str(doc_len), "--train-docs", str(train_docs), "--valid-docs", str(valid_docs)],
                   check=True, capture_output=True)


def error_lines(result):
    """The `moe-train:` lines of a run's stderr (log lines may precede them)."""
    return [l for l in result.stderr.splitlines() if l.startswith("moe-train:")]
