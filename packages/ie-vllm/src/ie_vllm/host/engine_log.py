"""A record of engine starts: one JSON line per start, appended to the file `IE_ENGINE_LOG` names.

Unset (the default), nothing is written. The test suite sets it (tests/engine_starts.py) to count
and time the engines a run starts; a server a test starts (`ie serve`) inherits it. Every
in-process engine starts in `Engine.start`; a server's engine is vLLM's own, recorded when the
server's plugin first sees it (`http_plugin.init_state`). docs/TESTING.md reads the record.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from typing import Any

ENV = "IE_ENGINE_LOG"


def _plain(value: Any) -> Any:
    """A JSON scalar as itself; anything else (a config dict, a class) by its type's name."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return type(value).__name__


def record_start(
    model: str, *, kind: str, hooked: bool, args: Mapping[str, Any], seconds: float, ok: bool
) -> None:
    """Append one start: `kind` is `engine` (in-process) or `server:<backend>`, `args` the
    arguments that tell this engine from another, `seconds` how long the start took."""
    path = os.environ.get(ENV)
    if not path:
        return
    line = {
        "model": model,
        "kind": kind,
        "hooked": hooked,
        "args": {k: _plain(v) for k, v in sorted(args.items())},
        "pid": os.getpid(),
        "seconds": round(seconds, 2),
        "ok": ok,
        "test": os.environ.get("PYTEST_CURRENT_TEST"),
    }
    with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")
