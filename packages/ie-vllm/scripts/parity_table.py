"""Print the parity table (point x family, max abs diff, vLLM vs eager, fp32 CPU).

Run: uv run python packages/ie-vllm/scripts/parity_table.py OUT.json [family ...]
(vLLM logs to stdout, so the table goes to a file.)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

FAMILIES = ["llama", "mistral", "qwen3", "mixtral", "gemma2", "gemma3", "gpt2"]
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"


def main() -> None:
    import torch
    from ie_core import load_model
    from vllm_parity import PROMPT_TEXT, by_point, parity

    torch.set_num_threads(1)
    out_path = Path(sys.argv[1])
    names = sys.argv[2:] or [SMOLLM2, *FAMILIES]
    table: dict[str, dict[str, float]] = {}
    for name in names:
        model_id = name if "/" in name else f"ie-synthetic/{name}"
        t0 = time.time()
        eager = load_model(model_id, backend="eager")
        ids = eager.to_tokens(PROMPT_TEXT)
        vllm = load_model(model_id, backend="vllm", max_model_len=256)
        try:
            table[name] = by_point(parity(vllm, eager, ids))
        finally:
            from ie_core.runner import run

            run(vllm.shutdown())
        print(
            name, f"{time.time() - t0:.0f}s", json.dumps(table[name]), flush=True, file=sys.stderr
        )
        out_path.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
