"""A client that starts a vLLM engine, prints the engine's process ids, then waits to be killed.

Run by test_vllm_watchdog.py: `python vllm_orphan_check.py MODEL`.
"""

from __future__ import annotations

import json
import sys
import time

import psutil
from ie_core import load_model


def main() -> None:
    load_model(sys.argv[1], backend="vllm", max_model_len=128)
    pids = [
        p.pid
        for p in psutil.Process().children(recursive=True)
        if not any("resource_tracker" in part for part in p.cmdline())
    ]
    print("PIDS " + json.dumps(pids), flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    main()
