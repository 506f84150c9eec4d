"""Benchmark: one prompt's patchscope reads at every layer of SmolLM2-135M (30 reads, the
Patchscopes identity target, greedy), sent as one batch of requests to hooked vLLM against the same
reads one by one on eager (issue 65's goal: at least 5x).

Both engines compute the same reads, so the record carries how many reads' tokens agree beside
the wall times. Loading and one warm-up pass are excluded from the timing. Run it alone (nothing
else on the machine):

    uv run --locked python benchmarks/patchscope_reads.py --out benchmarks/results/patchscope_reads.json

`--layers 2 --new-tokens 2 --repeats 1` is a quick run that only checks the program works.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SOURCE = "The Eiffel Tower is in the city of"


def _reads(model: Any, layers: list[int], new_tokens: int, batched: bool) -> list[tuple[int, ...]]:
    from ie_core.experiments.patchscopes import read_patchscopes
    from ie_core.protocol import SamplingParams
    from ie_core.runner import run

    sampling = SamplingParams(max_new_tokens=new_tokens, stop_at_eos=False)
    source = model.to_tokens(SOURCE)
    if batched:
        reads = run(read_patchscopes(model, source, -1, layers, sampling=sampling))
    else:
        reads = [
            run(read_patchscopes(model, source, -1, [layer], sampling=sampling))[0]
            for layer in layers
        ]
    return [r.token_ids for r in reads]


def _time(model: Any, layers: list[int], new_tokens: int, batched: bool, repeats: int) -> Any:
    _reads(model, layers, new_tokens, batched)  # warm-up
    walls = []
    out: list[tuple[int, ...]] = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = _reads(model, layers, new_tokens, batched)
        walls.append(time.perf_counter() - start)
    return min(walls), walls, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("patchscope_reads.json"))
    parser.add_argument("--layers", type=int, default=None, help="first N layers (default all)")
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from ie_core import load_model
    from ie_core.runner import run

    record: dict[str, Any] = {"model": MODEL, "source": SOURCE, "new_tokens": args.new_tokens}
    eager = load_model(MODEL, backend="eager", device="cpu", dtype="float32")
    layers = list(range(eager.n_layers if args.layers is None else args.layers))
    record["reads"] = len(layers)
    best, walls, eager_out = _time(eager, layers, args.new_tokens, False, args.repeats)
    record["eager_one_by_one"] = {"best_s": best, "walls_s": walls}
    run(eager.shutdown())

    vllm = load_model(MODEL, backend="vllm", dtype="float32", max_model_len=512)
    try:
        best, walls, vllm_out = _time(vllm, layers, args.new_tokens, True, args.repeats)
    finally:
        run(vllm.shutdown())
    record["vllm_one_batch"] = {"best_s": best, "walls_s": walls}
    record["speedup"] = record["eager_one_by_one"]["best_s"] / best
    record["reads_with_equal_tokens"] = sum(
        a == b for a, b in zip(eager_out, vllm_out, strict=True)
    )
    record["cpu_count"] = os.cpu_count()
    record["load_average"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
