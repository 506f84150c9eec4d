"""One request lifecycle in a worker, shared by hooked vLLM (`extension`) and vllm-static's
worker: a request's carried spec is registered the first time the request reaches a forward (or
kept as refused, with why), the host collects or drains its rows, and its key is released and
never registered again.

What differs between the two workers is behind `Sites`: how a request's sites are installed
(hooks on modules; a slot of compiled write tables), removed, and read back.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Generic, Protocol, TypeVar

import torch

from ie_vllm import payload
from ie_vllm.specs import RequestSpec
from ie_vllm.worker.layout import BatchLayout, RequestRows
from ie_vllm.worker.runner_adapter import carried_arrivals, record_layout

RETIRED_KEPT = 65536  # released keys remembered, so a late sight of one never re-registers it


class Registered(Protocol):
    """A registered request as a worker keeps it."""

    @property
    def spec(self) -> RequestSpec: ...


E = TypeVar("E", bound=Registered)


class Sites(Protocol[E]):
    """What a worker does with one request's sites: the part of the lifecycle that differs."""

    def install(self, spec: RequestSpec, req_id: str) -> E:
        """Take the request (vLLM's id `req_id`) on, or raise saying why it cannot be."""
        ...

    def uninstall(self, entry: E) -> None: ...

    def gather(self, entry: E, start: int, stop: int | None) -> dict[str, torch.Tensor]:
        """The request's rows for positions [start, stop), by address (`captures`)."""
        ...


class Keys(Generic[E]):
    """Registered requests by key, the keys already released, and those refused (with why)."""

    def __init__(self) -> None:
        self.entries: dict[str, E] = {}
        self.retired: dict[str, None] = {}  # insertion-ordered set
        self.refused: dict[str, str] = {}  # key -> why its carried spec could not be registered

    def add(self, entry: E) -> None:
        if entry.spec.key in self.entries:
            raise ValueError(f"request key {entry.spec.key!r} is already registered")
        self.entries[entry.spec.key] = entry

    def wants(self, key: str) -> bool:
        """A key seen in a forward that is neither registered nor released nor refused."""
        return key not in self.entries and key not in self.retired and key not in self.refused

    def get(self, key: str | None) -> E | None:
        return None if key is None else self.entries.get(key)

    def in_batch(self, layout: BatchLayout) -> Iterator[tuple[RequestRows, E]]:
        """Each registered request of a forward's batch, with its rows there."""
        for rows in layout.keyed():
            entry = self.get(rows.key)
            if entry is not None:
                yield rows, entry

    def pop(self, key: str) -> E | None:
        self.retired[key] = None
        if len(self.retired) > RETIRED_KEPT:
            del self.retired[next(iter(self.retired))]
        self.refused.pop(key, None)
        return self.entries.pop(key, None)


class Lifecycle(Generic[E]):
    """The host's calls on a worker's requests, over its `Keys` and its `Sites`. Only the
    `capture_rank` (one per tensor-parallel group) sends rows back."""

    def __init__(self, sites: Sites[E], keys: Keys[E], capture_rank: bool = True) -> None:
        self.sites = sites
        self.keys = keys
        self.capture_rank = capture_rank

    def arrive(self, runner: Any) -> BatchLayout:
        """The layout of the forward about to run, after registering the specs that requests new
        to this worker carry. A spec the worker cannot take is kept as refused (its collect raises
        with the reason), never raised here: an exception in the forward would stop the engine."""
        layout = record_layout(runner)
        for key, req_id, text in carried_arrivals(runner, layout, self.keys.wants):
            try:
                self.keys.add(self.sites.install(RequestSpec.from_json(text), req_id))
            except Exception as exc:
                self.keys.refused[key] = f"{type(exc).__name__}: {exc}"
        return layout

    def collect(
        self, key: str, start: int = 0, stop: int | None = None, release: bool = True
    ) -> dict[str, Any]:
        """Rows for positions [start, stop) of every captured address, as one payload; raises
        where the request's spec was refused."""
        why = self.keys.refused.get(key)
        if why is not None:
            self.release([key])
            raise RuntimeError(f"the worker could not register request {key}: {why}")
        entry = self.keys.get(key)
        out: dict[str, torch.Tensor] = {}
        if entry is not None and self.capture_rank:
            out = self.sites.gather(entry, start, stop)
        if release:
            self.release([key])
        return payload.encode(out)

    def drain(self, asks: Iterable[list[Any]]) -> dict[str, Any]:
        """Rows `[0, stop)` of each finished `[key, stop]` in one payload (`key/address` names,
        one copy to the host), each key released: the host's collects of one step, coalesced.
        `refused` names the keys whose carried spec this worker could not register, with why."""
        out: dict[str, torch.Tensor] = {}
        refused: dict[str, str] = {}
        for key, stop in asks:
            why = self.keys.refused.get(key)
            entry = self.keys.get(key)
            if why is not None:
                refused[key] = why
            elif entry is not None and self.capture_rank:
                got = self.sites.gather(entry, 0, int(stop))
                out.update((f"{key}/{name}", t) for name, t in got.items())
            self.release([key])
        return {"rows": payload.encode(out), "refused": refused}

    def release(self, keys: Iterable[str]) -> int:
        """Drop each key (retired: never registered again) and uninstall its sites; returns how
        many requests stay registered."""
        for key in keys:
            entry = self.keys.pop(key)
            if entry is not None:
                self.sites.uninstall(entry)
        return len(self.keys.entries)


__all__ = ["RETIRED_KEPT", "Keys", "Lifecycle", "Registered", "Sites"]
