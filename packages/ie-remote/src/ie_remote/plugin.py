"""ie-remote's `ie.backends` descriptor; importing it does not import httpx or torch."""

from __future__ import annotations

from typing import Any

from ie_core.backend_plugin import BackendPlugin


def _load(model_id: Any, **kw: Any) -> Any:
    from ie_remote.backend import load

    return load(model_id, **kw)


# A capability sweep needs a server to talk to, so remote has no sweep arguments and no engine.
REMOTE = BackendPlugin("remote", "ie-remote", _load, engine_packages={})

__all__ = ["REMOTE"]
