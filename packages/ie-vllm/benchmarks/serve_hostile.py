"""`ie serve` under hostile requests: /health latency during a 16 MB text prompt, memory after a
refused over-budget capture (issue 31's "must show").

Starts `ie serve MODEL --api-key` on a loopback port; polls `/health` every 20 ms from a thread
while a 16 MB text prompt is posted to `/v1/completions` and `/v1/ie/generate` (each must be a
400), then reads the API server's resident memory (`VmRSS`, and the peak `VmHWM`) before and
after a capture asking for ~2 GB of rows from a 0.6 MB body (must be a 413). Writes one JSON file
with the load sampled while it measures (`"quiet"`: the publish gate's test). A benchmark, not a
test; about 2-3 minutes on a quiet 2-core machine, most of it the server's start:

    uv run python packages/ie-vllm/benchmarks/serve_hostile.py
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from http_overhead import _port
from ie_core.tooling.load_sampling import LoadSampler

DEFAULT_OUT = Path(__file__).parent / "results" / "serve_hostile.json"
KEY = "bench-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
TEXT_BYTES = 16 * 2**20


def start_server(model: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    from http_overhead import start_server as plain

    os.environ["VLLM_API_KEY"] = KEY  # the server's key, without changing the shared starter
    return plain(model, port, log)


def _kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def health_during(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """Max and median `/health` latency while `body` is posted to `path`, and that answer."""
    latencies: list[float] = []
    done = threading.Event()
    payload = json.dumps(body).encode()  # encoded before polling starts: no client-side stall

    def poll() -> None:
        with httpx.Client(timeout=60) as client:
            while not done.is_set():
                start = time.perf_counter()
                client.get(f"{url}/health")
                latencies.append(time.perf_counter() - start)
                time.sleep(0.02)

    thread = threading.Thread(target=poll)
    thread.start()
    start = time.perf_counter()
    headers = {**AUTH, "content-type": "application/json"}
    r = httpx.post(f"{url}{path}", content=payload, headers=headers, timeout=600)
    answered = time.perf_counter() - start
    done.set()
    thread.join()
    latencies.sort()
    return {
        "status": r.status_code,
        "message": r.json().get("error", {}).get("message", "")[:200],
        "answered_s": answered,
        "health_max_s": latencies[-1],
        "health_median_s": latencies[len(latencies) // 2],
        "health_polls": len(latencies),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default="ie-synthetic/llama")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args()
    port, log = _port(), Path(tempfile.mkdtemp(prefix="ie-hostile-bench-")) / "server.log"
    server = start_server(args.model, port, log)
    url = f"http://127.0.0.1:{port}"
    try:
        text = ("lorem ipsum " * (TEXT_BYTES // 12 + 1))[:TEXT_BYTES]
        info = httpx.get(f"{url}/v1/ie/info", headers=AUTH, timeout=60).json()
        every = list(info["widths"])
        with LoadSampler() as sampler:
            prompt = {
                "completions": health_during(
                    url, "/v1/completions", {"model": args.model, "prompt": text, "max_tokens": 1}
                ),
                "ie_generate": health_during(url, "/v1/ie/generate", {"prompt": text}),
            }
            rss_before = _kib(server.pid, "VmRSS")
            body = {"prompts": [[1] * 500] * 200, "addresses": every}
            r = httpx.post(f"{url}/v1/ie/capture", json=body, headers=AUTH, timeout=600)
            time.sleep(1)
            memory = {
                "status": r.status_code,
                "message": r.json()["error"]["message"][:200],
                "rss_before_mib": rss_before / 1024,
                "rss_after_mib": _kib(server.pid, "VmRSS") / 1024,
                "peak_rss_mib": _kib(server.pid, "VmHWM") / 1024,
            }
        result = {
            "model": args.model,
            "text_prompt_bytes": TEXT_BYTES,
            "text_prompt": prompt,
            "over_budget_capture": memory,
            "load_while_measuring": sampler.summary(),
            "quiet": sampler.quiet() is True,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
