"""`StaticPolicy`: ie-vllm's `SitePolicy` narrowed to a vllm-static engine's declared taps.

The worker resolves every point as the hooked backend does; this engine reads only the sites it
tapped at load, writes only its declared write sites, and holds a bounded number of steering ops
per site and of position masks per request (the sizes of its parameter tables).
"""

from __future__ import annotations

from collections.abc import Mapping

from ie_core.errors import PointUnavailableError, SteeringSpecError, UnsupportedOperationError
from ie_core.grammar import get_point, to_address
from ie_vllm import SitePolicy, SteerSpec

from ie_static.config import StaticConfig
from ie_static.declared import describe
from ie_static.serving import static_serving


def unserved(address: str) -> str | None:
    """Why vllm-static serves this point on no model (the worker's table may still resolve it),
    or None: a reload that declares it would be refused too, so no reload hint is given."""
    name = to_address(address).name
    serving = static_serving(get_point(name))
    return None if serving.served else f"{name} is {serving.reason}"


def reload_hint(address: str, writes: bool) -> str:
    key = "static_writes" if writes else "static_points"
    return (
        f"reload with load_model(..., backend='vllm-static', {key}=[..., '{address}']) to "
        "declare it, or use backend='vllm' for any point chosen per request"
    )


class StaticPolicy(SitePolicy):
    """Read `reads` (the worker's `refused` reasons win), write `writes`, at most `config.ops` ops per site and `config.masks` masks."""

    def __init__(
        self,
        reads: tuple[str, ...],
        writes: tuple[str, ...],
        config: StaticConfig,
        refused: Mapping[str, str] | None = None,
    ):
        super().__init__(writes)
        self.refused = dict(refused or {})
        self.reads = reads
        self.writes = writes
        self.config = config
        self._reads = frozenset(reads)

    def check_read(self, address: str) -> None:
        if address in self._reads:
            return
        if address in self.refused:  # the worker's reason (e.g. a refused write) stands
            raise PointUnavailableError(self.refused[address])
        if why := unserved(address):
            raise PointUnavailableError(why)
        raise PointUnavailableError(
            f"{address} is not a declared site of this vllm-static engine, which taps "
            f"{describe(self.reads)}; {reload_hint(address, False)}"
        )

    def write_reason(self, address: str) -> str:
        if why := unserved(address):
            return why
        return f"this engine writes only at {describe(self.writes)}; {reload_hint(address, True)}"

    def check_steering(self, specs: tuple[SteerSpec, ...]) -> None:
        if any(s.until is not None for s in specs):
            raise UnsupportedOperationError(
                "a prefill-only steering scope is not available on backend 'vllm-static': its "
                "compiled steering tables select rows by prompt mask only; use backend='vllm' or "
                "'eager', or mask the prompt positions you want left alone"
            )
        for why in (op.static_refusal() for s in specs for op in s.ops):
            if why:  # the op says why the compiled tables cannot run it (a JumpReLU, a condition)
                raise UnsupportedOperationError(why)
        ops_at: dict[str, int] = {}
        masks = {frozenset(s.masked) for s in specs if s.masked}
        for s in specs:
            ops_at[s.address] = ops_at.get(s.address, 0) + len(s.ops)
        for address, n in ops_at.items():
            if n > self.config.ops:
                raise SteeringSpecError(
                    f"{n} steering ops at {address} exceed this engine's {self.config.ops} per "
                    f"site; reload with static_max_ops={n}"
                )
        _check_patches(specs, self.config.patch_rows)
        if len(masks) > self.config.masks:
            raise SteeringSpecError(
                f"{len(masks)} distinct position masks in one request exceed this engine's "
                f"{self.config.masks}; reload with static_masks={len(masks)}"
            )


def _check_patches(specs: tuple[SteerSpec, ...], rows: int) -> None:
    """One Patch per site per request, of at most `rows` positions (the patch table's size)."""
    seen: set[str] = set()
    for s in specs:
        for op in s.ops:
            n = op.patch_rows()
            if not n:
                continue
            if s.address in seen:
                raise SteeringSpecError(
                    f"two Patch ops at {s.address} in one request; vllm-static holds one per "
                    "site: merge them into one Patch over every position, or use backend='vllm'"
                )
            seen.add(s.address)
            if n > rows:
                raise SteeringSpecError(
                    f"a Patch of {n} positions at {s.address} exceeds this engine's {rows} patch "
                    f"rows per site; reload with static_patch_rows={n}, or use backend='vllm'"
                )


__all__ = ["StaticPolicy", "reload_hint"]
