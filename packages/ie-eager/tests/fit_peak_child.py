"""Child process of test_fit_eager_peak.py: the peak resident memory an eager capture adds.

A warm-up first: the same family's synthetic model is loaded and captured, so the modules a
load imports (the modeling file, the tokenizer) and the kernels' first-call state are in place;
it is dropped and freed memory handed back (`malloc_trim`). Then the baseline (VmRSS) and the
high-water mark reset (`/proc/self/clear_refs` 5, Linux), the load and one capture of
`addresses` over `tokens` token ids; prints JSON {"baseline", "peak", "delta"} in bytes.
Run as `python fit_peak_child.py MODEL WARMUP_MODEL TOKENS ADDR...`.
"""

from __future__ import annotations

import ctypes
import gc
import json
import sys
from pathlib import Path


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def main() -> None:
    import ie_eager.backend  # noqa: F401
    import torch
    import transformers  # noqa: F401
    from ie_core import capture, load_model

    torch.set_num_threads(1)
    model_id, warmup, tokens, addresses = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    small = load_model(warmup, backend="eager", device="cpu", dtype="float32")
    capture(small, [[3, 4, 5, 6]], ["resid_post.0", "attn_probs.0"])
    del small
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    baseline = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    model = load_model(model_id, backend="eager", device="cpu", dtype="float32")
    ids = [(i * 7919) % 500 + 3 for i in range(tokens)]
    cache = capture(model, [ids], addresses)
    assert len(cache.keys()) == len(addresses)
    peak = _status("VmHWM")
    print(json.dumps({"baseline": baseline, "peak": peak, "delta": peak - baseline}))


if __name__ == "__main__":
    main()
