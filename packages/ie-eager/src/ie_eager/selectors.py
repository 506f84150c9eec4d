"""Selectors: cut a point out of the tensor a hook sees, and write it back in place of it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from ie_core.errors import PointUnavailableError


@dataclass(frozen=True)
class Whole:
    """The tensor as it is, flattening a trailing [heads, head_dim] pair to one axis;
    `heads_first` marks a [batch, heads, seq, head_dim] layout (Gemma 3 norms after transposing)."""

    heads_first: bool = False

    def get(self, t: torch.Tensor) -> torch.Tensor:
        if t.dim() != 4:
            return t
        return (t.transpose(1, 2) if self.heads_first else t).flatten(-2)

    def put(self, t: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        if t.dim() != 4 or not self.heads_first:
            return new.reshape(t.shape)
        b, h, s, hd = t.shape
        return new.reshape(b, s, h, hd).transpose(1, 2)


@dataclass(frozen=True)
class Grouped:
    """Slot `index` of a last axis laid out as [groups, per_group, head_dim] (fused QKV).

    Contiguous thirds are one group; GPT-NeoX / BLOOM interleave [q, k, v] per head (groups =
    heads, per_group 3); Falcon's new decoder groups [q..., k, v] per KV head."""

    groups: int
    per_group: int
    index: int | slice
    head_dim: int

    def _view(self, t: torch.Tensor) -> torch.Tensor:
        return t.unflatten(-1, (self.groups, self.per_group, self.head_dim))

    def get(self, t: torch.Tensor) -> torch.Tensor:
        return self._view(t)[..., self.index, :].flatten(-2 if isinstance(self.index, int) else -3)

    def put(self, t: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        view = self._view(out)
        part = view[..., self.index, :]
        part.copy_(new.reshape(part.shape))
        return out


@dataclass(frozen=True)
class LastSlice:
    start: int
    stop: int

    def get(self, t: torch.Tensor) -> torch.Tensor:
        return t[..., self.start : self.stop]

    def put(self, t: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        return torch.cat([t[..., : self.start], new, t[..., self.stop :]], dim=-1)


@dataclass(frozen=True)
class GroupSlice:
    """Columns `start:stop` of each of `groups` equal groups of the last axis, flattened: the value
    part of MLA's per-head [k_nope | v] (kv_b_proj), or the gate half of Qwen3-Next's per-head
    [q | gate] (q_proj); `sigmoid` returns the gate as the multiplier the family applies."""

    groups: int
    start: int
    stop: int
    sigmoid: bool = False

    def _view(self, t: torch.Tensor) -> torch.Tensor:
        return t.unflatten(-1, (self.groups, -1))

    def get(self, t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 4 and t.shape[1] == 1:  # MLA expands the latent as [batch, 1, seq, rank]
            t = t[:, 0]
        part = self._view(t)[..., self.start : self.stop].flatten(-2)
        return torch.sigmoid(part) if self.sigmoid else part

    def put(self, t: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        if self.sigmoid:
            raise PointUnavailableError("the attention gate is captured, not written")
        out = t.clone()
        part = self._view(out)[..., self.start : self.stop]
        part.copy_(new.reshape(part.shape))
        return out


@dataclass(frozen=True)
class Stream:
    """Residual stream `index` of a [batch, seq, n_streams, d_model] hyper-connection trunk."""

    index: int

    def get(self, t: torch.Tensor) -> torch.Tensor:
        return t[..., self.index, :]

    def put(self, t: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        out[..., self.index, :] = new.reshape(out[..., self.index, :].shape)
        return out


@dataclass(frozen=True)
class Broadcast:
    """KV heads broadcast to every query head, [batch, kv * groups, seq, head_dim] (Falcon's new
    decoder expands keys before the rotary): one copy per KV head is read, a write fills all."""

    groups: int

    def get(self, t: torch.Tensor) -> torch.Tensor:
        b, h, s, hd = t.shape
        return (
            t.reshape(b, h // self.groups, self.groups, s, hd)[:, :, 0].transpose(1, 2).flatten(-2)
        )

    def put(self, t: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        b, h, s, hd = t.shape
        kv = new.reshape(b, s, h // self.groups, hd).transpose(1, 2).unsqueeze(2)
        return kv.expand(b, h // self.groups, self.groups, s, hd).reshape(t.shape)


Selector = Broadcast | Whole | Grouped | LastSlice | GroupSlice | Stream
