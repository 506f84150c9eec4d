"""One forward's hooks: reads (captures) and writes (steering) grouped per module site.

At each site the actions run in forward order of the points, each point's writes before its
read, so a capture is post-intervention. Hooks are removed when the session closes, exceptions
included. A read-only session returns nothing from its hooks, so the forward is untouched.

A session is entered around each forward of its request only (the decode loop enters it once per
step), and its hooks act only while that forward runs in the context that entered it: a
suspended stream leaves nothing installed, and a forward from another thread that meets the
hooks passes through them untouched.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from ie_core.errors import PointUnavailableError, SteeringSpecError
from ie_core.grammar import Address
from ie_core.ops.apply import apply_ops
from ie_core.ops.conditional import with_judged
from torch import nn

from ie_eager import attention, rotary
from ie_eager.actions import (
    REMEMBER_AT,
    Action,
    Capture,
    Judge,
    Remember,
    Steer,
    Write,
    in_order,
)
from ie_eager.resolve import Resolved, Tap

# The session whose forward is running in this context; hooks of any other session pass.
_ACTIVE: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "ie_eager_session", default=None
)


@dataclass
class Session:
    """Install with `with Session(model, reads, writes) as s:`; run forwards; read `s.captured`."""

    model: nn.Module
    reads: Sequence[Resolved]
    writes: Sequence[Write] = ()
    keep_graph: bool = False
    captured: dict[Address, torch.Tensor] = field(default_factory=dict)
    offset: int = 0  # absolute position of the first row of the current forward
    batch_shape: tuple[int, int] = (0, 0)
    _handles: list[Any] = field(default_factory=list)
    _token: contextvars.Token[Session | None] | None = None
    _seen_base: dict[int, torch.Tensor] = field(default_factory=dict)
    _attn_calls: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)
    # (id(write), op index) -> where that op's condition held, judged earlier in this forward.
    _held: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)

    def __enter__(self) -> Session:
        if self._handles:
            raise RuntimeError("a Session is entered once at a time")
        self._held.clear()
        try:
            self._install()
        except BaseException:
            self.close()
            raise
        self._token = _ACTIVE.set(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._token is not None:
            _ACTIVE.reset(self._token)
            self._token = None

    def _mine(self) -> bool:
        return _ACTIVE.get() is self

    # -- installation --

    def _install(self) -> None:
        # how (a key of _INSTALLERS) -> id(module) -> (module, its actions), in request order;
        # the installers that run actions in sequence put them in their order (`in_order`).
        groups: dict[str, dict[int, tuple[nn.Module, list[Action]]]] = {h: {} for h in _INSTALLERS}

        def add(tap: Tap, action: Action) -> None:
            kind = action.resolved.kind
            how = kind if kind in _OWN_INSTALL else tap.io
            groups[how].setdefault(id(tap.module), (tap.module, []))[1].append(action)

        def remember(r: Resolved) -> None:
            if r.kind in REMEMBER_AT:
                assert r.base is not None
                add(r.base, Remember(r, 0))

        for i, w in enumerate(self.writes):
            add(w.resolved.tap, Steer(w.resolved, i, w))
            remember(w.resolved)
            for j, r in w.conditions:
                add(r.tap, Judge(r, i, w, j))
                remember(r)
        for i, r in enumerate(self.reads):
            add(r.tap, Capture(r, i))
            remember(r)
        for how, installer in _INSTALLERS.items():
            for module, actions in groups[how].values():
                installer(self, module, actions)

    def _install_pre(self, module: nn.Module, actions: list[Action]) -> None:
        hook = self._pre_hook(in_order(actions))
        self._handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def _install_out(self, module: nn.Module, actions: list[Action]) -> None:
        hook = self._out_hook(in_order(actions))
        self._handles.append(module.register_forward_hook(hook, with_kwargs=True))

    # -- hook bodies --

    def _pre_hook(self, actions: list[Action]):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> Any:
            if not self._mine():
                return None
            if args:
                base = args[0]
            elif "hidden_states" in kwargs:
                base = kwargs["hidden_states"]
            else:
                raise PointUnavailableError(
                    f"{type(module).__name__} was called without hidden states to read"
                )
            new = self._run(actions, {0: base})[0]
            if new is base:
                return None
            if args:
                return (new, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": new}

        return hook

    def _out_hook(self, actions: list[Action]):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            if not self._mine():
                return None
            if isinstance(output, torch.Tensor):
                new = self._run(actions, {0: output})[0]
                return None if new is output else new
            if isinstance(output, tuple | list):
                items = dict(enumerate(output))
                new_items = self._run(actions, items)
                if all(new_items[k] is items[k] for k in items):
                    return None
                return type(output)(new_items[k] for k in range(len(output)))
            raise PointUnavailableError(
                f"{type(module).__name__} returned {type(output).__name__}, not a tensor or tuple"
            )

        return hook

    def _run(self, actions: list[Action], items: dict[int, Any]) -> dict[int, Any]:
        items = dict(items)
        for action in actions:
            action.run(self, items)
        return items

    # -- what the actions call --

    def remember(self, r: Resolved, base: torch.Tensor) -> None:
        self._seen_base[id(r)] = base

    def hold(self, w: Write, op_index: int, held: torch.Tensor) -> None:
        self._held[(id(w), op_index)] = held

    def _rows_view(self, t: torch.Tensor) -> torch.Tensor:
        """[batch*seq, ...] (OPT's MLP, MoE routers) viewed as [batch, seq, ...]."""
        b, s = self.batch_shape
        if t.dim() == 2 and b * s and t.shape[0] == b * s:
            return t.reshape(b, s, *t.shape[1:])
        return t

    def value(self, r: Resolved, raw: torch.Tensor) -> torch.Tensor:
        t = r.compose(self._rows_view(r.tap.select.get(raw)), self._base(r))
        # Clone: some blocks add into a sublayer's output in place afterwards (Falcon's `+=`).
        return t.clone() if self.keep_graph else t.detach().clone()

    def _base(self, r: Resolved) -> torch.Tensor | None:
        """The first term of a derived point, recorded earlier in this forward; None for others."""
        if r.kind not in REMEMBER_AT:
            return None
        base = self._seen_base.get(id(r))
        if base is None:
            raise RuntimeError(
                f"{r.address}: the first term of this sum was not recorded earlier in the forward"
            )
        return base

    def write(self, r: Resolved, w: Write, raw: torch.Tensor) -> torch.Tensor:
        flat = r.tap.select.get(raw)
        part = self._rows_view(flat)
        if w.width is not None and part.shape[-1] != w.width:
            raise SteeringSpecError(
                f"steering vector for {r.address} has width {w.width}, but the tensor there is "
                f"{part.shape[-1]} wide on this model"
            )
        base = self._base(r)
        h = r.compose(part, base)
        steered = self._apply(w, h)
        _check_finite(r, h, steered)
        steered = r.decompose(steered, base)
        return r.tap.select.put(raw, steered.to(raw.dtype).reshape(flat.shape))

    def _apply(self, w: Write, h: torch.Tensor) -> torch.Tensor:
        rows = self._rows(w, h)
        held = self._judged(w)
        if w.batch_rows is None:
            ops = with_judged(w.ops, held)
            return apply_ops(h, ops, rows, self._positions(h))
        idx = torch.tensor(w.batch_rows, device=h.device)
        part = h.index_select(0, idx)
        out = h.clone()
        ops = with_judged(w.ops, {j: m[idx] for j, m in held.items()})
        out[idx] = apply_ops(part, ops, None if rows is None else rows[idx], self._positions(part))
        return out

    def _judged(self, w: Write) -> dict[int, torch.Tensor]:
        """The write's conditions judged at their earlier points in this forward (used once)."""
        held: dict[int, torch.Tensor] = {}
        for j, r in w.conditions:
            got = self._held.pop((id(w), j), None)
            if got is None:
                raise PointUnavailableError(
                    f"the condition for {w.resolved.address} reads {r.address}, which this "
                    "model did not compute before it in the forward; read a point of an "
                    "earlier layer"
                )
            held[j] = got
        return held

    def _positions(self, h: torch.Tensor) -> torch.Tensor:
        """Absolute positions of `h`'s rows ([batch, seq]): the forward starts at `offset`."""
        seq = h.shape[1]
        return torch.arange(self.offset, self.offset + seq, device=h.device).expand(h.shape[:2])

    def _rows(self, w: Write, h: torch.Tensor) -> torch.Tensor | None:
        if not any(w.masked):
            return None
        batch, seq = h.shape[0], h.shape[1]
        positions = range(self.offset, self.offset + seq)
        rows = [[p not in w.masked[b] for p in positions] for b in range(batch)]
        return torch.tensor(rows, dtype=torch.bool, device=h.device)

    # -- attention --

    def _install_attention(self, module: nn.Module, actions: list[Action]) -> None:
        items = [a.resolved for a in actions]
        if not attention.install(module):
            names = ", ".join(str(r.address) for r in items)
            raise PointUnavailableError(
                f"{names}: {type(module).__name__} does not compute softmax through torch.nn.functional "
                "in its modeling module, so its scores cannot be recorded exactly"
            )
        calls: list[tuple[torch.Tensor, torch.Tensor]] = []
        tokens: list[Any] = []

        def record(scores: torch.Tensor, probs: torch.Tensor) -> None:
            calls.append((scores, probs))

        def pre(mod: nn.Module, args: tuple, kwargs: dict) -> None:
            if not self._mine():
                return
            calls.clear()
            tokens.append(attention.CURRENT.set(record))

        def post(mod: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if not self._mine():
                return
            if tokens:
                attention.CURRENT.reset(tokens.pop())
            if len(calls) != 1:
                names = ", ".join(str(r.address) for r in items)
                raise PointUnavailableError(
                    f"{names}: expected one softmax inside {type(mod).__name__}, saw {len(calls)}; "
                    "this attention does not expose one score tensor"
                )
            scores, probs = attention.strip_sinks(mod, *calls[0])
            dtype = output[0].dtype if isinstance(output, tuple) else scores.dtype
            for r in items:
                t = scores if r.address.name == "attn_scores" else probs.to(dtype)
                self.captured[r.address] = t if self.keep_graph else t.detach().clone()
            calls.clear()  # else each layer's maps stay alive beside their copies until its next call

        self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        self._handles.append(module.register_forward_hook(post, with_kwargs=True, always_call=True))

    def _install_rotary(self, module: nn.Module, actions: list[Action]) -> None:
        actions = in_order(actions)
        names = ", ".join(str(a.resolved.address) for a in actions)
        if not rotary.install(module):
            raise PointUnavailableError(
                f"{names}: {type(module).__name__}'s modeling module has no "
                f"{rotary.NAME} to observe; read q / k instead"
            )
        calls: list[int] = []
        tokens: list[Any] = []

        def edit(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            calls.append(1)
            if calls[1:]:
                raise PointUnavailableError(
                    f"{names}: {type(module).__name__} applies the rotary embedding more than "
                    "once per forward, so no one call holds the whole rotated heads; read q / k"
                )
            for t in (q, k):
                if t.dim() != 4:
                    raise PointUnavailableError(
                        f"{names}: the rotary call returned a {t.dim()}-d tensor, not "
                        "[batch, heads, seq, head_dim]; read q / k"
                    )
            items = self._run(actions, {0: q, 1: k})
            return items[0], items[1]

        def pre(mod: nn.Module, args: tuple, kwargs: dict) -> None:
            if not self._mine():
                return
            calls.clear()
            tokens.append(rotary.CURRENT.set(edit))

        def post(mod: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if not self._mine() or not tokens:
                return
            rotary.CURRENT.reset(tokens.pop())
            if not calls and output is not None:  # None: the forward raised; keep its error
                raise PointUnavailableError(
                    f"{names}: {type(mod).__name__} made no {rotary.NAME} call in this forward "
                    "(no rotary embedding on this layer); read q / k"
                )

        self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        self._handles.append(module.register_forward_hook(post, with_kwargs=True, always_call=True))


def _check_finite(r: Resolved, before: torch.Tensor, after: torch.Tensor) -> None:
    """Refuse a write that turned finite activations into inf / NaN (the values are too large
    for the activations' dtype): otherwise the model would silently decode garbage."""
    if bool((torch.isfinite(before) & ~torch.isfinite(after)).any()):
        raise SteeringSpecError(
            f"steering at {r.address} produced inf or NaN from finite activations in "
            f"{after.dtype}: the ops' values are too large for these activations; use smaller "
            "coefficients or bounds"
        )


# How a site's actions are installed, in this order: module hooks by io, then the points whose
# own module installs them (softmax scores, the rotary call).
_INSTALLERS: dict[str, Callable[[Session, nn.Module, list[Action]], None]] = {
    "in": Session._install_pre,
    "out": Session._install_out,
    "attention": Session._install_attention,
    "rotary": Session._install_rotary,
}
_OWN_INSTALL = frozenset({"attention", "rotary"})
