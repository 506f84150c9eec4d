"""What a hook does at its site, one type per action: steer (a write), judge (a condition),
capture (a read), remember (the first term of a derived point). Each runs itself on the site's
tensors; `PHASES` states once the order of the actions at one point."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from ie_core.errors import PointUnavailableError
from ie_core.grammar import POINTS_BY_NAME, Address
from ie_core.ops import SteeringOp
from ie_core.ops.conditional import judge

from ie_eager.resolve import Resolved


@dataclass(frozen=True)
class Write:
    """Steering ops at one resolved address; `masked[b]` are row b's unsteered prompt positions."""

    resolved: Resolved
    ops: tuple[SteeringOp, ...]
    masked: tuple[frozenset[int], ...]
    width: int | None  # None: every op fits any width (Scale, Hook)
    # The batch rows it steers (one prompt's own steering in a batch); None: every row.
    batch_rows: tuple[int, ...] | None = None
    # (op index, the earlier point its condition reads): judged there in each forward.
    conditions: tuple[tuple[int, Resolved], ...] = ()


class Session(Protocol):
    """The session an action runs in (`ie_eager.hooks.Session`): what the actions call."""

    captured: dict[Address, torch.Tensor]

    def write(self, r: Resolved, w: Write, raw: torch.Tensor) -> torch.Tensor: ...

    def value(self, r: Resolved, raw: torch.Tensor) -> torch.Tensor: ...

    def hold(self, w: Write, op_index: int, held: torch.Tensor) -> None: ...

    def remember(self, r: Resolved, base: torch.Tensor) -> None: ...


Order = tuple[int, int, int]

RANK = {name: i for i, name in enumerate(POINTS_BY_NAME)}
# resid_streams.L is the stack that resid_post.L.stream-N slices (one tensor at one site): it
# takes resid_post's place in the order, so every write to either lands before every read of
# either (a resid_post read after a resid_streams write sees the write, and the reverse).
RANK["resid_streams"] = RANK["resid_post"]


def _rank(r: Resolved) -> int:
    # Path addresses are not in the registry and run last at their site.
    return RANK.get(r.address.name, len(RANK))


@dataclass(frozen=True)
class Action:
    """One action at a site; `index` (its place in the request) breaks ties at one point."""

    resolved: Resolved
    index: int

    def order(self) -> Order:
        return (_rank(self.resolved), PHASES.index(type(self)), self.index)

    def run(self, session: Session, items: dict[int, Any]) -> None:
        raise NotImplementedError(type(self).__name__)

    def tensor(self, items: dict[int, Any]) -> torch.Tensor:
        r = self.resolved
        raw = items[r.tap.item]
        if not isinstance(raw, torch.Tensor):
            raise PointUnavailableError(
                f"{r.address}: {r.tap.path} produced no tensor at item {r.tap.item}"
            )
        return raw


@dataclass(frozen=True)
class Steer(Action):
    """Replace the point's tensor with the write's ops applied to it."""

    write: Write

    def run(self, session: Session, items: dict[int, Any]) -> None:
        items[self.resolved.tap.item] = session.write(self.resolved, self.write, self.tensor(items))


@dataclass(frozen=True)
class Judge(Action):
    """Where the condition of the write's op `op_index` holds, held for the later write."""

    write: Write
    op_index: int

    def run(self, session: Session, items: dict[int, Any]) -> None:
        value = session.value(self.resolved, self.tensor(items))
        session.hold(self.write, self.op_index, judge(self.write.ops[self.op_index], value))


@dataclass(frozen=True)
class Capture(Action):
    """The point's value (after its writes) into the session's captures."""

    def run(self, session: Session, items: dict[int, Any]) -> None:
        session.captured[self.resolved.address] = session.value(self.resolved, self.tensor(items))


@dataclass(frozen=True)
class Remember(Action):
    """The first term of a derived point, recorded as the forward passes it (`REMEMBER_AT`)."""

    def order(self) -> Order:
        return REMEMBER_AT[self.resolved.kind]

    def run(self, session: Session, items: dict[int, Any]) -> None:
        session.remember(self.resolved, items[0])


# The order of the actions at one point: its writes, then what reads the written tensor.
PHASES: tuple[type[Action], ...] = (Steer, Judge, Capture, Remember)


def in_order(actions: list[Action]) -> list[Action]:
    """A site's actions in the order they run (stable: equal orders keep request order)."""
    return sorted(actions, key=lambda a: a.order())


# Derived kinds and when their base is remembered. `sum` (resid_mid) needs the block input as
# the block sees it: after resid_pre's writes and reads. A `branch`'s routed-MLP output is
# remembered after every action at its site (path writes), so the sum is what the layer adds.
REMEMBER_AT: dict[str, Order] = {
    "sum": (RANK["resid_pre"], PHASES.index(Remember), 0),
    "branch": (len(RANK) + 1, 0, 0),
}
