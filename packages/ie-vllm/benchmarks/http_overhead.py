"""HTTP path against in-process: capture latency and MB/s, steered vs plain completion tok/s.

Starts `ie serve MODEL` on a loopback port and the same model in-process (two engines), runs
one unrecorded warm-up round, then interleaves the workloads round-robin over `--repeats` so each
ratio is measured under one condition. Before each timed call it waits `SETTLE_S`: an idle vLLM
worker keeps spinning on its shared-memory queue for a second after its last step, and that spin
would otherwise compete with the next workload on the other engine. Writes one JSON file with the
load sampled while it measures (`ie_core.tooling.load_sampling`): figures taken while other processes
competed (the publish gate's bound) are marked `"quiet": false` and are not performance figures. A benchmark, not a test; one command, a few
minutes on a quiet 2-core machine with the defaults (on a shared machine, wrap it in the engine
slot, `/work/bin/vllm-slot`):

    uv run python packages/ie-vllm/benchmarks/http_overhead.py
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
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from ie_core import Additive, SamplingParams, load_model, steer_at
from ie_core.runner import run
from ie_core.tooling.load_sampling import SETTLE_S, LoadSampler

DEFAULT_OUT = Path(__file__).parent / "results" / "http_overhead.json"
PROMPT_TOKENS = 384  # + --new-tokens must stay within the 512 positions both engines get


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
    time.sleep(SETTLE_S)
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default="ie-synthetic/llama")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args()

    port = _port()
    load_before = os.getloadavg()
    log = Path(tempfile.mkdtemp(prefix="ie-http-bench-")) / "server.log"
    server = start_server(args.model, port, log)
    try:
        local = load_model(
            args.model, backend="vllm", max_model_len=512, enable_prefix_caching=False
        )
        remote = load_model(f"http://127.0.0.1:{port}", backend="remote")
        # PROMPT_TOKENS ids of plain text (the synthetic tokenizer spends ~3 per word).
        ids = local.to_tokens("The quick brown fox jumps over the lazy dog. " * 64)[:PROMPT_TOKENS]
        widths = remote.info.widths  # type: ignore[attr-defined]  # RemoteModel
        # Every per-token point the server serves (attention maps are seq x seq: left out).
        every = [a for a in widths if not a.startswith(("attn_scores", "attn_p"))]
        spec = steer_at("resid_post.1", Additive([1.0] * local.d_model, 2.0))
        params = SamplingParams(max_new_tokens=args.new_tokens, stop_at_eos=False)
        workloads = (
            ("capture_in_process_s", lambda: run(local.capture([ids], every))),
            ("capture_http_s", lambda: run(remote.capture([ids], every))),
            ("generate_plain_in_process_s", lambda: run(local.generate(ids, params))),
            ("generate_plain_http_s", lambda: run(remote.generate(ids, params))),
            ("generate_steered_http_s", lambda: run(remote.generate(ids, params, steering=spec))),
        )
        for _, fn in workloads:  # warm-up, not recorded
            fn()
        samples: dict[str, list[float]] = {}
        nbytes = 0
        with LoadSampler() as sampler:
            for _ in range(args.repeats):  # round-robin: every variant once per round
                for name, fn in workloads:
                    seconds, out = timed(fn)
                    samples.setdefault(name, []).append(seconds)
                    if name == "capture_http_s":
                        nbytes = sum(t.numel() * t.element_size() for t in out.values())
        med = {k: statistics.median(v) for k, v in samples.items()}
        load_after, cpus = os.getloadavg(), os.cpu_count() or 1
        result = {
            "model": args.model,
            "prompt_tokens": len(ids),
            "capture_points": len(every),
            "capture_mib": nbytes / 2**20,
            "median_s": med,
            "capture_http_mib_s": nbytes / 2**20 / med["capture_http_s"],
            "capture_in_process_mib_s": nbytes / 2**20 / med["capture_in_process_s"],
            "capture_http_over_in_process": med["capture_http_s"] / med["capture_in_process_s"],
            "capture_http_extra_ms": 1000 * (med["capture_http_s"] - med["capture_in_process_s"]),
            "new_tokens": args.new_tokens,
            "plain_in_process_tok_s": args.new_tokens / med["generate_plain_in_process_s"],
            "plain_http_tok_s": args.new_tokens / med["generate_plain_http_s"],
            "steered_http_tok_s": args.new_tokens / med["generate_steered_http_s"],
            "samples": samples,
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            "cpu_count": cpus,
            "settle_s": SETTLE_S,
            "load_while_measuring": sampler.summary(),
            "quiet": sampler.quiet() is True,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=2))
        run(local.shutdown())
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
