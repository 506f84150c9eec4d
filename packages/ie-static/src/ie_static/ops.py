"""The taps: `torch.library` custom ops that Dynamo and inductor treat as opaque calls.

`read_tap(x, buf)` copies the rows of `x` into the preallocated `buf`; `read_sum_tap(h, r, buf)`
does the same for `h + r` (vLLM's residual convention) in one pass. `write_tap(...)` returns `x`
with per-row steering applied from parameter tables the host fills before each step. The mutated
buffers are declared in `mutates_args`, so the graph keeps the call and inductor reinplaces it
instead of copying the buffer.

Every op kind reduces to one form per op slot k (see `tables.encode_op`):
    p = h . u_k ;  g = a*p + b*(clamp(p, lo, hi) - p) + c*|h| + e ;  h <- h + g * w_k
computed in fp32 and cast back, so one branch-free kernel serves any mix of ops and requests,
which is what a CUDA graph needs (it replays the kernels recorded at capture, not Python).
Replacing ops (`Patch`, `Scale`) take an affine slot instead: h <- h * mul_k + row, where the row
is the slot's patch row for the position (zero for a scale), so a patch writes its values exactly.
"""

from __future__ import annotations

import torch

# Column order of a coefficient row: see `tables.encode_op`.
ALPHA, BETA, LO, HI, GAMMA, CONST = range(6)
N_COEF = 6


class _StepFlags:
    """Host-side per-step facts the CPU fast path may use (never read while a graph is captured)."""

    any_steered: bool = True
    any_captured: bool = True  # some row of this step belongs to a request that captures


STEP = _StepFlags()


def _rows_guard(n: int, capacity: int, what: str) -> None:
    if n > capacity:
        raise RuntimeError(
            f"ie_static {what}: {n} token rows exceed the tap buffer's {capacity} rows; "
            "the engine was sized for fewer batched tokens (max_num_batched_tokens)"
        )


def _graph_capturing(x: torch.Tensor) -> bool:
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def _skip_read(x: torch.Tensor) -> bool:
    """Outside graph capture the host knows whether any row is read this step; skip the copy."""
    return not STEP.any_captured and not _graph_capturing(x)


@torch.library.custom_op("ie_static::read_tap", mutates_args=("buf",))
def read_tap(x: torch.Tensor, buf: torch.Tensor) -> None:
    """Copy the `n` rows of `x` into `buf[:n]`."""
    n = x.shape[0]
    _rows_guard(n, buf.shape[0], "read_tap")
    if _skip_read(x):
        return
    buf[:n].copy_(x.reshape(n, -1))


@read_tap.register_fake
def _(x: torch.Tensor, buf: torch.Tensor) -> None:
    return None


@torch.library.custom_op("ie_static::read_sum_tap", mutates_args=("buf",))
def read_sum_tap(h: torch.Tensor, r: torch.Tensor, buf: torch.Tensor) -> None:
    """Write `h + r` (the residual stream of a vLLM decoder layer) into `buf[:n]`."""
    n = h.shape[0]
    _rows_guard(n, buf.shape[0], "read_sum_tap")
    if _skip_read(h):
        return
    torch.add(h.reshape(n, -1), r.reshape(n, -1), out=buf[:n])


@read_sum_tap.register_fake
def _(h: torch.Tensor, r: torch.Tensor, buf: torch.Tensor) -> None:
    return None


def _patch_rows(
    positions: torch.Tensor, slot: torch.Tensor, patch_pos: torch.Tensor, patch_vals: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(hit [n], row [n, D]): whether each row's slot patches its position, and with what."""
    pp = patch_pos[slot]  # [n, R]
    match = (pp == positions.unsqueeze(-1)) | (pp == -2)
    first = match.to(torch.int32).argmax(-1)
    return match.any(-1), patch_vals[slot, first]


def steer_rows(
    x: torch.Tensor,
    positions: torch.Tensor,
    row_slot: torch.Tensor,
    active: torch.Tensor,
    coef: torch.Tensor,
    vecs: torch.Tensor,
    mask_idx: torch.Tensor,
    masks: torch.Tensor,
    affine: torch.Tensor,
    is_patch: torch.Tensor,
    mul: torch.Tensor,
    patch_pos: torch.Tensor,
    patch_vals: torch.Tensor,
) -> torch.Tensor:
    """Branch-free steering of `x` ([n, D]); shapes:

    row_slot [R] int (request slot of each row, -1 = unsteered), positions [>=n] int,
    active [S, K] bool, coef [S, K, 6] fp32, vecs [S, K, 2, D] fp32 (u, w),
    mask_idx [S, K] int (-1 = no mask), masks [S, Q, P] bool (True = prompt position not steered),
    affine / is_patch [S, K] bool, mul [S, K, D] fp32, patch_pos [S, Rp] int, patch_vals [S, Rp, D].
    Rows with no op on are returned bit-identical.
    """
    n = x.shape[0]
    slot = row_slot[:n].long()
    valid = slot >= 0
    s = slot.clamp(min=0)
    absolute = positions[:n].long()
    pos = absolute.clamp(0, masks.shape[2] - 1)
    hit, row = _patch_rows(absolute, s, patch_pos, patch_vals)
    h = x.float()
    any_on = torch.zeros_like(valid)
    for k in range(coef.shape[1]):
        mi = mask_idx[s, k].long()
        held = masks[s, mi.clamp(min=0), pos] & (mi >= 0)
        on = valid & active[s, k] & ~held
        c = coef[s, k]
        u = vecs[s, k, 0]
        w = vecs[s, k, 1]
        p = (h * u).sum(-1)
        capped = torch.minimum(torch.maximum(p, c[:, LO]), c[:, HI]) - p
        g = c[:, ALPHA] * p + c[:, BETA] * capped + c[:, GAMMA] * h.norm(dim=-1) + c[:, CONST]
        g = torch.where(on, g, torch.zeros_like(g))
        patching = is_patch[s, k]
        replaced = h * mul[s, k] + torch.where(patching.unsqueeze(-1), row, torch.zeros_like(row))
        replace = on & affine[s, k] & (hit | ~patching)
        h = torch.where(replace.unsqueeze(-1), replaced, h + g.unsqueeze(-1) * w)
        any_on = any_on | on
    return torch.where(any_on.unsqueeze(-1), h.to(x.dtype), x)


@torch.library.custom_op("ie_static::write_tap", mutates_args=())
def write_tap(
    x: torch.Tensor,
    positions: torch.Tensor,
    row_slot: torch.Tensor,
    active: torch.Tensor,
    coef: torch.Tensor,
    vecs: torch.Tensor,
    mask_idx: torch.Tensor,
    masks: torch.Tensor,
    affine: torch.Tensor,
    is_patch: torch.Tensor,
    mul: torch.Tensor,
    patch_pos: torch.Tensor,
    patch_vals: torch.Tensor,
) -> torch.Tensor:
    """`x` with each row's steering applied (a new tensor; `x` is untouched)."""
    _rows_guard(x.shape[0], row_slot.shape[0], "write_tap")
    # Outside graph capture the host knows whether any row is steered this step; skip the math.
    if not STEP.any_steered and not _graph_capturing(x):
        return x.clone()
    tables = (active, coef, vecs, mask_idx, masks, affine, is_patch, mul, patch_pos, patch_vals)
    if x.is_cuda:  # branch-free over every row: what a CUDA graph records and replays
        return steer_rows(x, positions, row_slot, *tables)
    return _steer_written_rows(x, positions, row_slot, *tables)


def _steer_written_rows(
    x: torch.Tensor, positions: torch.Tensor, row_slot: torch.Tensor, *tables: torch.Tensor
) -> torch.Tensor:
    """On the CPU (no graph to keep): the math on only the rows whose request has an op on at
    this site; a site no request of the step writes costs one copy."""
    n = x.shape[0]
    slot = row_slot[:n].long()
    active = tables[0]
    written = ((slot >= 0) & active[slot.clamp(min=0)].any(-1)).nonzero().squeeze(-1)
    out = x.clone()
    if written.numel():
        out[written] = steer_rows(x[written], positions[:n][written], slot[written], *tables)
    return out


@write_tap.register_fake
def _(x: torch.Tensor, *tables: torch.Tensor) -> torch.Tensor:
    # The schema comes from `write_tap`'s signature; the fake only needs the output's shape.
    return torch.empty_like(x)
