"""Module accessors `model.layers[3].self_attn.output[0]`: parse once, use from nnsight or hooks."""

from __future__ import annotations

import re
from dataclasses import dataclass

_ACCESSOR = re.compile(
    r"^(?P<module>[A-Za-z_][\w.\[\]]*)\.(?P<io>input|output)(?:\[(?P<index>\d+)\])?$"
)


@dataclass(frozen=True)
class Accessor:
    module: str  # dotted path with numeric parts: model.layers.3.self_attn
    io: str  # "input" or "output"
    index: int | None  # element of a tuple output

    @property
    def parts(self) -> list[str]:
        return self.module.split(".")


def parse_accessor(text: str) -> Accessor:
    m = _ACCESSOR.fullmatch(text)
    if m is None:
        raise ValueError(f"not a module accessor: {text!r} (want path.input / path.output[i])")
    module = re.sub(r"\[(\d+)\]", r".\1", m.group("module"))
    index = m.group("index")
    return Accessor(module, m.group("io"), int(index) if index is not None else None)
