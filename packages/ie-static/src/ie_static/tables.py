"""Steering parameter tables: per write site, per request slot, per op slot, on the device.

The host encodes each `SteeringOp` into one coefficient row and two vectors (`encode_op`), writes
them into the slot of the request once at registration, and the write tap reads them every step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from ie_core.errors import SteeringSpecError
from ie_core.ops import Replacement, SteeringOp
from ie_vllm import to_device

from ie_static.ops import ALPHA, BETA, CONST, GAMMA, HI, LO, N_COEF

_LIKE = torch.zeros((), dtype=torch.float32)  # ops build their vectors on the CPU in fp32


def encode_op(op: SteeringOp) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(coef [6], u [D], w [D]) of the op's affine form (`Op.affine`), which normalises vectors
    exactly as the op's own delta does, so the deltas agree to rounding."""
    if op.width is None:
        raise SteeringSpecError(f"{op.kind} has no vector to encode; it is an affine op")
    form = op.affine(_LIKE)
    if form is None:
        raise SteeringSpecError(f"unknown steering op {op!r}")
    coef = torch.zeros(N_COEF, dtype=torch.float32)
    coef[ALPHA], coef[BETA], coef[GAMMA], coef[CONST] = (
        form.alpha,
        form.beta,
        form.gamma,
        form.const,
    )
    coef[LO], coef[HI] = form.lo, form.hi
    return coef, form.u, form.w


@dataclass(frozen=True)
class TableShape:
    """Sizes fixed at load: request slots S, op slots K per site, masks Q per slot, positions P,
    and R patch rows per slot and site (the rows one `Patch` may write)."""

    slots: int
    ops: int
    masks: int
    positions: int
    patch_rows: int = 16


# `patch_pos` entries: an unused row, and a row written at every position (`Patch(positions=None)`).
UNUSED, EVERY = -1, -2


@dataclass
class WriteTable:
    """One write site's parameters: which op slots are on, their coefficients and vectors, and
    for replacing ops (`Op.replacement`: `Patch`, `Scale`) h <- h * mul + patch row, the row chosen by position."""

    active: torch.Tensor  # [S, K] bool
    coef: torch.Tensor  # [S, K, 6] fp32
    vecs: torch.Tensor  # [S, K, 2, D] fp32
    mask_idx: torch.Tensor  # [S, K] int32, -1 = unmasked
    affine: torch.Tensor  # [S, K] bool: the slot replaces (h * mul + row) instead of adding
    is_patch: torch.Tensor  # [S, K] bool: the affine slot adds the slot's patch row where it hits
    mul: torch.Tensor  # [S, K, D] fp32
    patch_pos: torch.Tensor  # [S, R] int64: the position each patch row is written at
    patch_vals: torch.Tensor  # [S, R, D] fp32 (zero outside the patched heads' columns)

    @classmethod
    def empty(cls, shape: TableShape, width: int, device: torch.device) -> WriteTable:
        s, k, r = shape.slots, shape.ops, shape.patch_rows
        return cls(
            active=torch.zeros(s, k, dtype=torch.bool, device=device),
            coef=torch.zeros(s, k, N_COEF, dtype=torch.float32, device=device),
            vecs=torch.zeros(s, k, 2, width, dtype=torch.float32, device=device),
            mask_idx=torch.full((s, k), -1, dtype=torch.int32, device=device),
            affine=torch.zeros(s, k, dtype=torch.bool, device=device),
            is_patch=torch.zeros(s, k, dtype=torch.bool, device=device),
            mul=torch.ones(s, k, width, dtype=torch.float32, device=device),
            patch_pos=torch.full((s, r), UNUSED, dtype=torch.long, device=device),
            patch_vals=torch.zeros(s, r, width, dtype=torch.float32, device=device),
        )

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The tables in the write tap's argument order."""
        return (
            self.active, self.coef, self.vecs, self.mask_idx,
            self.affine, self.is_patch, self.mul, self.patch_pos, self.patch_vals,
        )  # fmt: skip

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def fill(self, slot: int, ops: Sequence[tuple[SteeringOp, int]]) -> None:
        """Put `(op, mask index)` pairs, in order, into `slot`; the rest of the slot turns off."""
        k_max = self.active.shape[1]
        if len(ops) > k_max:
            raise SteeringSpecError(
                f"{len(ops)} steering ops at one site exceed this vllm-static engine's "
                f"{k_max} op slots per site; reload with static_max_ops={len(ops)} or more"
            )
        if sum(op.patch_rows() > 0 for op, _ in ops) > 1:
            raise SteeringSpecError(
                "vllm-static holds one Patch per site per request (its patch rows are one table "
                "per slot); merge the patches into one Patch with every position, or use "
                "backend='vllm'"
            )
        self.clear(slot)
        for k, (op, mask) in enumerate(ops):
            form = op.replacement(self.mul.shape[-1], _LIKE)
            if form is not None:
                self._fill_replacement(slot, k, form)
            else:
                coef, u, w = encode_op(op)
                # Built on the host; to CUDA through pinned memory, not waiting for the stream.
                self.coef[slot, k] = to_device(coef, self.coef.device)
                self.vecs[slot, k, 0] = to_device(u, self.vecs.device)
                self.vecs[slot, k, 1] = to_device(w, self.vecs.device)
            self.mask_idx[slot, k] = mask
            self.active[slot, k] = True

    def _fill_replacement(self, slot: int, k: int, form: Replacement) -> None:
        self.coef[slot, k, LO], self.coef[slot, k, HI] = -math.inf, math.inf
        self.affine[slot, k] = True
        self.mul[slot, k] = to_device(form.mul, self.mul.device)
        if form.values is None:
            return
        positions = (EVERY,) if form.positions is None else form.positions
        rows_max = self.patch_pos.shape[1]
        if len(positions) > rows_max:
            raise SteeringSpecError(
                f"a Patch of {len(positions)} positions exceeds this vllm-static engine's "
                f"{rows_max} patch rows per site; reload with static_patch_rows={len(positions)} "
                "or more, or use backend='vllm'"
            )
        n = len(positions)
        self.is_patch[slot, k] = True
        self.patch_pos[slot, :n] = to_device(
            torch.tensor(positions, dtype=torch.long), self.patch_pos.device
        )
        self.patch_vals[slot, :n] = to_device(form.values, self.mul.device).expand(n, -1)

    def clear(self, slot: int) -> None:
        self.active[slot] = False
        self.coef[slot] = 0.0
        self.vecs[slot] = 0.0
        self.mask_idx[slot] = -1
        self.affine[slot] = False
        self.is_patch[slot] = False
        self.mul[slot] = 1.0
        self.patch_pos[slot] = UNUSED
        self.patch_vals[slot] = 0.0


def table_bytes(shape: TableShape, width: int) -> int:
    """Bytes of one site's `WriteTable` (see `WriteTable.empty`)."""
    s, k, r = shape.slots, shape.ops, shape.patch_rows
    per_op = 1 + 4 * N_COEF + 4 * 2 * width + 4 + 2 + 4 * width
    return s * k * per_op + s * r * (8 + 4 * width)
