"""The interventions file: steering, patches and feature clamps applied to every eval request.

Its format is `ie serve`'s steering JSON (`ie_core.wire`): a list of specs, each
`{"point", "layers", "ops": [{"kind": ...}, ...], "mask", "stream"}`, so one file serves the eval
harnesses in-process and the `ie_steering` field of an HTTP request alike. It is read and checked
against the model (layers, widths) before any forward.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ie_core import Steering
from ie_core.errors import InterpError, SteeringSpecError
from ie_core.grammar import check_layer
from ie_core.wire import steering_from_wire, steering_to_wire


class InterventionsFileError(SteeringSpecError):
    """An interventions file that cannot be read, is not the steering JSON, or does not fit the
    model it is applied to; the message names the file."""


def parse_interventions(data: Any, source: str = "interventions") -> tuple[Steering, ...]:
    """Specs from decoded JSON (a list of steering specs, as `ie serve` takes them)."""
    try:
        return steering_from_wire(data)
    except InterpError as exc:  # a spec or an op's own check (unknown kind, bad vector, ...)
        raise InterventionsFileError(f"{source}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise InterventionsFileError(f"{source}: malformed steering spec: {exc}") from None


def load_interventions(path: str | Path) -> tuple[Steering, ...]:
    """Specs from an interventions file (UTF-8 JSON)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InterventionsFileError(f"cannot read the interventions file {file}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InterventionsFileError(
            f"{file} is not JSON ({exc}); an interventions file is a JSON list of steering specs "
            '[{"point": "resid_post", "layers": [3], "ops": [{"kind": "additive", ...}]}]'
        ) from None
    return parse_interventions(data, str(file))


def check_interventions(model: Any, specs: Sequence[Steering], source: str = "") -> None:
    """Refuse specs whose layers or widths do not fit `model` (before any forward: a harness run
    would otherwise fail on its first batch, after tokenising the whole task)."""
    where = f"{source}: " if source else ""
    for spec in specs:
        for address in spec.addresses():
            try:
                check_layer(address, model.n_layers, "steering")
                spec.check_width(model.point_width(address))
            except InterpError as exc:
                raise InterventionsFileError(f"{where}{exc}") from None


def write_interventions(path: str | Path, specs: Steering | Sequence[Steering]) -> Path:
    """Write specs in the interventions format (the wire encoder, so the server reads it too)."""
    file = Path(path)
    file.write_text(json.dumps(steering_to_wire(specs)), encoding="utf-8")
    return file


__all__ = [
    "InterventionsFileError",
    "check_interventions",
    "load_interventions",
    "parse_interventions",
    "write_interventions",
]
