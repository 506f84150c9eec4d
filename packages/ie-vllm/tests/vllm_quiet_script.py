"""A plain vLLM script as a new user writes it: load SmolLM2, one capture, a last line.

Run by test_vllm_quiet.py in a subprocess (`python vllm_quiet_script.py`): it prints what
`model.info` says as one `INFO {...}` line, then its last line `LAST <shape>`; the caller counts
every other line of the output (vLLM's, torch's, ours) and looks at how it ends.
"""

from __future__ import annotations

import json

from ie_core import capture, load_model

if __name__ == "__main__":  # vLLM spawns its engine processes: they import this file too
    model = load_model("HuggingFaceTB/SmolLM2-135M-Instruct", backend="vllm", max_model_len=128)
    cache = capture(model, "The capital of France is", ["resid_post.3"])
    info = model.info
    fields = {"model_id": info.model_id, "backend": info.backend, "points": list(info.points)}
    print("INFO " + json.dumps({**fields, "repr": repr(info)}), flush=True)
    print("LAST", tuple(cache["resid_post.3"].shape), flush=True)
