"""Helpers for the harvest tests: a deterministic corpus, and the kill check run as its own
process (`python eager_harvest_support.py OUT REF SEED`).

The kill check loads the synthetic model once with one torch thread (so forking is safe: no
thread pool exists), then forks a child per harvest attempt and SIGKILLs it at a random moment,
or, once, while a shard file is half written (the write pauses halfway under
`IE_HARVEST_WRITE_PAUSE_S`). A last child resumes to the end; another child writes an
uninterrupted reference. It prints a JSON report of the kills."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

WORDS = [
    "the",
    "a",
    "river",
    "cat",
    "model",
    "layer",
    "runs",
    "over",
    "blue",
    "quickly",
    "token",
    "Paris",
    "東京",
    "naïve",
    "—",
    "42",
    "sky",
]
POINTS = ["resid_post.1", "mlp_out.0"]
OPTIONS = {"context": 24, "shard_tokens": 72, "batch_windows": 2, "max_tokens": 1500}


def write_corpus(path: Path, documents: int = 80, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    docs = [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 30))) for _ in range(documents)
    ]
    path.write_text("".join(d + "\n\n" for d in docs), encoding="utf-8")
    return docs


def _child(model: object, corpus: Path, out: Path) -> None:
    from ie_core.harvest import harvest

    harvest(model, out, POINTS, files=[corpus], progress=False, **OPTIONS)
    os._exit(0)


def _attempt(model: object, corpus: Path, out: Path, delay: float | None) -> dict[str, object]:
    pid = os.fork()
    if pid == 0:
        _child(model, corpus, out)
    began = time.perf_counter()
    if delay is None:  # kill while a shard is half written
        while not any(out.glob(".shard-*.tmp")) and time.perf_counter() - began < 120:
            time.sleep(0.002)
        time.sleep(0.05)
    else:
        time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return {
        "after_s": round(time.perf_counter() - began, 3),
        "killed": os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL,
        "half_written": sorted(p.name for p in out.glob(".*.tmp")),
        "shards_on_disk": len(list(out.glob("shard-*.safetensors"))),
    }


def _run_to_end(model: object, corpus: Path, out: Path) -> int:
    pid = os.fork()
    if pid == 0:
        _child(model, corpus, out)
    _, status = os.waitpid(pid, 0)
    return os.WEXITSTATUS(status)


def kill_check(out: Path, ref: Path, seed: int) -> dict[str, object]:
    import torch

    torch.set_num_threads(1)
    from ie_eager.backend import load
    from ie_eager.synthetic import build

    model = load(str(build("llama")), device="cpu", dtype="float32")
    corpus = out.parent / "corpus.txt"
    write_corpus(corpus)
    rng = random.Random(seed)
    os.environ["IE_HARVEST_WRITE_PAUSE_S"] = "0.15"
    delays: list[float | None] = [rng.uniform(0.2, 2.5) for _ in range(5)]
    delays.insert(rng.randrange(len(delays)), None)
    kills = [_attempt(model, corpus, out, d) for d in delays]
    os.environ["IE_HARVEST_WRITE_PAUSE_S"] = "0"
    return {
        "kills": kills,
        "resume_rc": _run_to_end(model, corpus, out),
        "ref_rc": _run_to_end(model, corpus, ref),
    }


if __name__ == "__main__":
    report = kill_check(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
    print(json.dumps(report))
