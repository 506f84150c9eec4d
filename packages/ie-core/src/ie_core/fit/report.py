"""`FitReport`: the priced items against a target, the verdict, what to change; as a table or
JSON. Torch-free."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ie_core.fit.items import GIB, Item
from ie_core.fit.targets import Target

__all__ = ["FitReport"]


def gib(n: float) -> str:
    return f"{n / GIB:,.2f} GiB"


@dataclass(frozen=True)
class FitReport:
    model: str
    backend: str
    target: Target
    dtype: str  # weights and activations as loaded
    tokens: int  # max-model-len (vLLM) / prompt length (eager)
    streams: int
    parameters: int
    items: tuple[Item, ...]

    @property
    def total(self) -> int:
        return sum(i.nbytes for i in self.items)

    @property
    def margin(self) -> int:
        """Bytes left in the budget (negative: short by that much)."""
        return self.target.budget - self.total

    @property
    def fits(self) -> bool:
        return self.margin >= 0

    def advice(self) -> tuple[str, ...]:
        """What to change, largest item first, until the shortfall is covered (empty if it fits)."""
        if self.fits:
            return ()
        out, short = [], -self.margin
        for item in sorted(self.items, key=lambda i: -i.nbytes):
            if short <= 0 or item.nbytes == 0 or not item.remedy:
                continue
            out.append(f"{item.name} ({gib(item.nbytes)}): {item.remedy}")
            short -= item.nbytes
        out.append(f"or a target with at least {gib(self.total / self._share())} of memory")
        return tuple(out)

    def _share(self) -> float:
        return self.target.budget / self.target.total if self.target.total else 1.0

    def verdict(self) -> str:
        word = "fits" if self.fits else "does not fit"
        how = "to spare" if self.fits else "short"
        return (
            f"{self.model} on {self.backend} {word} {self.target.name}: {gib(self.total)} of "
            f"{gib(self.target.budget)} ({self.target.note}), {gib(abs(self.margin))} {how}"
        )

    def table(self) -> str:
        """The items, the total and the verdict as plain text."""
        width = max(len(i.name) for i in self.items)
        lines = [f"{'item':<{width}}  {'GiB':>10}  how"]
        for i in self.items:
            lines.append(f"{i.name:<{width}}  {i.nbytes / GIB:>10,.3f}  {i.note}")
        lines.append(f"{'total':<{width}}  {self.total / GIB:>10,.3f}")
        lines.append(self.verdict())
        lines.extend(f"  change: {a}" for a in self.advice())
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "backend": self.backend,
            "target": asdict(self.target),
            "dtype": self.dtype,
            "tokens": self.tokens,
            "streams": self.streams,
            "parameters": self.parameters,
            "items": [asdict(i) for i in self.items],
            "total_bytes": self.total,
            "margin_bytes": self.margin,
            "fits": self.fits,
            "verdict": self.verdict(),
            "advice": list(self.advice()),
        }
