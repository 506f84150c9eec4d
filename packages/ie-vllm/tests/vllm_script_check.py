"""A plain script (no event loop of its own) using the sync API on the vLLM backend.

Run by test_vllm_script.py in a subprocess: `python vllm_script_check.py MODEL TP [exit]`; prints
one JSON line with what it saw (its last line), including the engine processes left after
shutdown and what `model.info` says. With `exit` it never calls shutdown(), as many scripts do:
the caller checks that the interpreter's exit stopped the engine cleanly and quietly.
"""

from __future__ import annotations

import json
import sys

import psutil
from ie_core import capture, generate, load_model
from ie_core.errors import PointUnavailableError
from ie_core.experiments.lens_stream import stream_lens
from ie_core.sync import SyncModel


def still_running(pids: list[int]) -> list[int]:
    return [
        pid
        for pid in pids
        if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    ]


def main() -> None:
    model_id, tp = sys.argv[1], int(sys.argv[2])
    at_exit = sys.argv[3:] == ["exit"]
    kw = {"max_model_len": 128}
    if tp > 1:
        kw["tensor_parallel_size"] = tp
    model = load_model(model_id, backend="vllm", **kw)
    sync = SyncModel(model)
    last = f"resid_post.{model.n_layers - 1}"
    cache = capture(model, "hello world, hello", [last, "resid_post.0", "mlp_out.1"])
    gen = generate(model, "hello world", max_new_tokens=4, stop_at_eos=False)
    steps = list(stream_lens(model, "hello world", [last, "resid_post.0"], k=3, max_new_tokens=3))
    lens = {
        a: {"ids": [s.topk[a].ids.tolist() for s in steps],
            "probs": [s.topk[a].probs.tolist() for s in steps]}
        for a in (last, "resid_post.0")
    }  # fmt: skip
    refused = {}
    for address in ("z.0", "value.1", "mlp_act.0", "attn_probs.0"):
        try:
            sync.capture("hello", [address])
            refused[address] = ""
        except PointUnavailableError as exc:
            refused[address] = str(exc)
    # multiprocessing's resource tracker serves the whole process and exits with it: not the engine's.
    engine_pids = [
        p.pid
        for p in psutil.Process().children(recursive=True)
        if not any("resource_tracker" in part for part in p.cmdline())
    ]
    if not at_exit:
        sync.shutdown()
    left = [] if at_exit else still_running(engine_pids)
    info = model.info
    out = {
        "info": {
            "model_id": info.model_id,
            "backend": info.backend,
            "points": list(info.points),
            "repr": repr(info),
        },
        "tokens": list(gen.token_ids),
        "rows": {k: cache[k].tolist() for k in (last, "resid_post.0", "mlp_out.1")},
        "refused": refused,
        "lens": lens,
        "engine_pids": engine_pids,
        "left": left,
    }
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
