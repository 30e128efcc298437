"""What the distributed benchmarks share: a free port and a run's mean step time."""
import json
import socket


def port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mean_step(run):
    """Mean step_time_s of a run's training records after the first 3 (warm-up)."""
    recs = [json.loads(l) for l in open(run / "metrics.jsonl")]
    t = [r["step_time_s"] for r in recs if r["type"] == "train"][3:]
    return sum(t) / len(t)
