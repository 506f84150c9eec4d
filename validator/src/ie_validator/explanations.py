"""Why a cell of the matrix is not a pass: a declared gap or a named upstream bug, as data.

Keys are `(engine, family)`; `*` matches any family. The README lists every non-pass cell with
its explanation, and `UNEXPLAINED` where none is recorded, so a new failure cannot hide.
"""

from __future__ import annotations

from typing import Any

EXPLANATIONS: dict[tuple[str, str], str] = {}


def explain(engine: str, family: str, result: dict[str, Any]) -> str:
    return EXPLANATIONS.get((engine, family)) or EXPLANATIONS.get((engine, "*"), "")
