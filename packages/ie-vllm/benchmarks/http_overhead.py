"""HTTP path against in-process: capture latency and MB/s, steered vs plain completion tok/s.

Starts `ie serve MODEL` on a loopback port and the same model in-process (two engines), then
interleaves the workloads round-robin over `--repeats` so each ratio is measured under one
condition. Writes one JSON file with the load average before and after. A benchmark, not a test:

    uv run python packages/ie-vllm/benchmarks/http_overhead.py --model ie-synthetic/llama \
        --out packages/ie-vllm/benchmarks/results/http_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from ie_core import Additive, SamplingParams, load_model, steer_at
from ie_core.runner import run


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(model: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    ie = Path(sys.executable).with_name("ie")
    cmd = [str(ie), "serve", model, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--max-model-len", "512", "--disable-uvicorn-access-log", "--no-enable-prefix-caching"]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"ie serve exited ({proc.returncode}); see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(2)


def timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ie-synthetic/llama")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--out", default="http_overhead.json")
    args = parser.parse_args()

    port = _port()
    load_before = os.getloadavg()
    server = start_server(args.model, port, Path(args.out).with_suffix(".server.log"))
    try:
        local = load_model(
            args.model, backend="vllm", max_model_len=512, enable_prefix_caching=False
        )
        remote = load_model(f"http://127.0.0.1:{port}", backend="remote")
        ids = local.to_tokens("The quick brown fox jumps over the lazy dog. " * 8)
        every = [f"resid_post.{i}" for i in range(local.n_layers)]
        spec = steer_at("resid_post.1", Additive([1.0] * local.d_model, 2.0))
        params = SamplingParams(max_new_tokens=args.new_tokens, stop_at_eos=False)
        samples: dict[str, list[float]] = {}
        nbytes = 0
        for _ in range(args.repeats):  # round-robin: every variant once per round
            for name, fn in (
                ("capture_in_process_s", lambda: run(local.capture([ids], every))),
                ("capture_http_s", lambda: run(remote.capture([ids], every))),
                ("generate_plain_http_s", lambda: run(remote.generate(ids, params))),
                (
                    "generate_steered_http_s",
                    lambda: run(remote.generate(ids, params, steering=spec)),
                ),
            ):
                seconds, out = timed(fn)
                samples.setdefault(name, []).append(seconds)
                if name == "capture_http_s":
                    nbytes = sum(t.numel() * t.element_size() for t in out.values())
        med = {k: statistics.median(v) for k, v in samples.items()}
        result = {
            "model": args.model,
            "prompt_tokens": len(ids),
            "capture_points": len(every),
            "capture_mib": nbytes / 2**20,
            "median_s": med,
            "capture_http_mib_s": nbytes / 2**20 / med["capture_http_s"],
            "http_over_in_process": med["capture_http_s"] / med["capture_in_process_s"],
            "steered_tok_s": args.new_tokens / med["generate_steered_http_s"],
            "plain_tok_s": args.new_tokens / med["generate_plain_http_s"],
            "samples": samples,
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "cpu_count": os.cpu_count(),
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=2))
        run(local.shutdown())
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)


if __name__ == "__main__":
    main()
