"""ie-static builds on ie-vllm's declared surface only, and its channel and policy keep the
behaviour the backend had (worker calls, slots per steered request, declared-set refusals)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import ie_static
import ie_vllm
import pytest
from ie_core.errors import PointUnavailableError, SteeringSpecError
from ie_core.ops import Additive
from ie_core.wire import SLOT_XARG, SPEC_XARG
from ie_static.channel import StaticChannel
from ie_static.config import StaticConfig
from ie_static.policy import StaticPolicy
from ie_vllm import RequestSpec, SteerSpec

PACKAGE = Path(ie_static.__file__).parent
SCRIPTS = PACKAGE.parents[1] / "scripts"


def _ie_vllm_imports(path: Path) -> list[str]:
    """Every module path ie-vllm is imported under in `path`, and every name taken from it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ie_vllm"):
            found += [f"{node.module}:{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("ie_vllm")]
    return found


def test_ie_static_imports_only_ie_vllms_public_names() -> None:
    files = sorted(PACKAGE.glob("*.py")) + sorted(SCRIPTS.glob("*.py"))
    bad = []
    for path in files:
        for imp in _ie_vllm_imports(path):
            module, _, name = imp.partition(":")
            if module != "ie_vllm" or name not in ie_vllm.__all__:
                bad.append(f"{path.name}: {imp}")
    assert bad == []


def test_the_import_check_catches_a_private_module(tmp_path: Path) -> None:
    # Negative control: a private-module import is reported.
    path = tmp_path / "x.py"
    path.write_text("from ie_vllm.host.backend import VLLMModel\n")
    assert _ie_vllm_imports(path) == ["ie_vllm.host.backend:VLLMModel"]


class _Engine:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def rpc(self, method: str, *args: Any) -> list[Any]:
        self.calls.append((method, *args))
        if method == "ie_static_drain":
            return [{"rows": ie_vllm.payload.encode({}), "refused": {}}]
        return [0]

    async def rpc_payload(self, method: str, *args: Any) -> dict[str, Any]:
        self.calls.append((method, *args))
        return {}


def _steered(key: str) -> RequestSpec:
    return RequestSpec(key, (), (SteerSpec("resid_post.0", (Additive((1.0,)),)),), 2)


async def _settle() -> None:
    """Let every runnable task run to its next real wait (the fake engine never blocks)."""
    for _ in range(20):
        await asyncio.sleep(0)


def test_channel_gives_steered_requests_slots_and_frees_them() -> None:
    engine = _Engine()
    channel = StaticChannel(engine, slots=2)  # type: ignore[arg-type]

    def slot(xargs: dict[str, str]) -> int:
        return int(xargs[SLOT_XARG])

    async def flow() -> None:
        # The spec and its slot ride in the request's extra_args: no call reaches the engine.
        a = await channel.attach(_steered("a"))
        b = await channel.attach(RequestSpec("b", ("resid_post.0",), (), 2))
        assert engine.calls == []
        assert RequestSpec.from_json(a[SPEC_XARG]) == _steered("a")
        assert slot(a) in (0, 1) and slot(b) == -1  # unsteered: no slot
        await channel.finish("a", 2)
        assert engine.calls[-1] == ("ie_static_drain", [["a", 2]])
        await channel.release(["b"])
        assert engine.calls[-1] == ("ie_static_release", ["b"])
        # Both slots are free again: two more steered requests attach without waiting.
        c, d = await channel.attach(_steered("c")), await channel.attach(_steered("d"))
        assert sorted([slot(c), slot(d)]) == [0, 1]
        # A third waits for a slot (negative control: the semaphore really bounds) and gets the
        # one "c" frees once the workers released it.
        third = asyncio.ensure_future(channel.attach(_steered("e")))
        await _settle()
        assert not third.done()
        await channel.release(["c"])
        await _settle()
        assert third.done()
        assert slot(await third) == slot(c)
        # Requests finishing in the same loop turn share one drain.
        engine.calls.clear()
        await asyncio.gather(channel.finish("d", 2), channel.finish("e", 2))
        assert engine.calls == [("ie_static_drain", [["d", 2], ["e", 2]])]

    asyncio.run(flow())


def test_policy_narrows_reads_writes_and_bounds_steering() -> None:
    config = StaticConfig(("resid_post.0", "resid_post.1"), ("resid_post.1",), 4, 1, 1)
    policy = StaticPolicy(("resid_post.0", "resid_post.1"), ("resid_post.1",), config)
    policy.check_read("resid_post.0")
    with pytest.raises(PointUnavailableError, match=r"not a declared site.*static_points"):
        policy.check_read("resid_post.2")
    assert policy.can_write("resid_post.1") and not policy.can_write("resid_post.0")
    assert "static_writes" in policy.write_reason("resid_post.0")
    op = Additive((1.0,))
    policy.check_steering((SteerSpec("resid_post.1", (op,), (0,)),))
    with pytest.raises(SteeringSpecError, match="static_max_ops=2"):
        policy.check_steering((SteerSpec("resid_post.1", (op, op)),))
    with pytest.raises(SteeringSpecError, match="static_masks=2"):
        policy.check_steering(
            (SteerSpec("resid_post.1", (op,), (0,)), SteerSpec("resid_post.1", (), (1,)))
        )


def test_policy_refuses_a_conditional_op_with_the_reason_and_the_backend_to_use() -> None:
    """A Conditional is not affine (the row decides whether it writes): refused at admission,
    before any forward, by the op's own reason; a ReLU FeatureClamp still passes."""
    from ie_core.errors import UnsupportedOperationError
    from ie_core.ops import Conditional, FeatureClamp

    config = StaticConfig(("resid_post.1",), ("resid_post.1",))
    policy = StaticPolicy(("resid_post.1",), ("resid_post.1",), config)
    cond = Conditional(Additive((1.0, 0.0)), (0.0, 1.0), threshold=0.5)
    with pytest.raises(UnsupportedOperationError, match=r"Conditional.*affine.*backend='vllm'"):
        policy.check_steering((SteerSpec("resid_post.1", (cond,)),))
    policy.check_steering((SteerSpec("resid_post.1", (FeatureClamp((1.0,), (1.0,)),)),))
    with pytest.raises(UnsupportedOperationError, match="JumpReLU"):
        policy.check_steering(
            (SteerSpec("resid_post.1", (FeatureClamp((1.0,), (1.0,), threshold=0.1),)),)
        )


def test_a_read_site_whose_write_was_refused_is_still_read() -> None:
    """The worker's refusals also hold refused writes: they must not hide a declared read."""
    config = StaticConfig(("resid_mid.0",), ())
    policy = StaticPolicy(("resid_mid.0",), (), config, {"resid_mid.0": "read only here"})
    policy.check_read("resid_mid.0")  # no raise
    assert not policy.can_write("resid_mid.0")


def test_the_policy_gives_the_workers_reason_not_a_reload_hint() -> None:
    config = StaticConfig(("resid_post.0",), ())
    policy = StaticPolicy(("resid_post.0",), (), config, {"attn_in.0": "no such module here"})
    with pytest.raises(PointUnavailableError, match="no such module here"):
        policy.check_read("attn_in.0")
    # Without the worker's reason, an undeclared site gets the reload hint.
    with pytest.raises(PointUnavailableError, match=r"not a declared site.*static_points"):
        StaticPolicy(("resid_post.0",), (), config).check_read("attn_in.0")
