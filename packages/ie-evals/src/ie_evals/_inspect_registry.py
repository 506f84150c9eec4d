"""Inspect AI's entry point (`[project.entry-points.inspect_ai]`): registers the provider name
`interp-engine`; the provider module (torch, ie-core) is imported only when a model is made."""

from __future__ import annotations

from typing import Any

from inspect_ai.model import modelapi


@modelapi(name="interp-engine")
def interp_engine() -> Any:
    from ie_evals.inspect_provider import InterpEngineAPI

    return InterpEngineAPI
