"""The cheat sheet claims no more than the backends serve.

What the dashboard's cards show (rendered through the dashboard's own `views.serving`) is turned
back into claims and checked against the live backend by `check_claims`: each check-marked point
must capture a finite tensor of the documented shape, each cross must raise the backend's refusal
with the shown reason. A negative control feeds the same checker deliberately wrong claims; a
drift test pins the committed eager answers to `model.capabilities()`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ie_eager")
pytest.importorskip("ie_dashboard")

from ie_core.capabilities import PointCapability, load_capabilities
from ie_core.grammar import FAMILIES, POINTS
from ie_core.loading import load_model
from ie_core.runner import run
from ie_core.tooling.capability_sweep import check_claims, load_kwargs
from ie_dashboard import views
from ie_dashboard.config import database_url
from ie_dashboard.db import Database
from ie_dashboard.registry import seed_registry
from ie_eager.synthetic import FAMILIES as SYNTHETIC

BUILT = [f.slug for f in FAMILIES if f.slug in SYNTHETIC]  # registry families with a build
UNBUILT = [f.slug for f in FAMILIES if f.slug not in SYNTHETIC]


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    db = Database(database_url(Path(tmp_path_factory.mktemp("dash")) / "dashboard.sqlite"))
    db.migrate()
    with db.write() as session:
        seed_registry(session)
    yield db
    db.dispose()


@cache
def eager(family: str) -> Any:
    return load_model(f"ie-synthetic/{family}", backend="eager")


def dashboard_claims(db: Database, family: str, backend: str) -> dict[str, PointCapability]:
    """What the cards of `family` show for `backend`, as claims (a "not verified" row claims
    nothing and is left out)."""
    with db.read() as session:
        arch = views.get_architecture(session, family)
        rows = {
            name: next(r for r in views.serving(p, family) if r.backend == backend)
            for name, p in arch.presence.items()
        }
    return {
        name: PointCapability(r.served, r.writable, r.layers, r.reason)
        for name, r in rows.items()
        if r.verified
    }


@pytest.mark.parametrize("family", BUILT)
def test_eager_cards_equal_what_eager_does(dashboard: Database, family: str) -> None:
    claims = dashboard_claims(dashboard, family, "eager")
    assert len(claims) == len(POINTS), "the eager sweep answers every point of a built family"
    assert check_claims(eager(family), claims) == []


@pytest.mark.parametrize("family", UNBUILT)
def test_cards_without_a_build_show_no_check_mark(dashboard: Database, family: str) -> None:
    for backend in ("eager", "vllm", "vllm-static"):
        assert dashboard_claims(dashboard, family, backend) == {}, backend


def _flip(claims: dict[str, PointCapability], name: str, **change: Any) -> dict[str, Any]:
    return {**claims, name: dataclasses.replace(claims[name], **change)}


def test_negative_control_wrong_claims_are_caught(dashboard: Database) -> None:
    """The same checker, fed the llama cards with one claim made wrong each time."""
    model = eager("llama")
    claims = dashboard_claims(dashboard, "llama", "eager")
    assert check_claims(model, claims) == []
    every = tuple(range(model.n_layers))
    # A refused point claimed served (the bug this test exists for: a check mark that fails).
    wrong = check_claims(model, _flip(claims, "q_norm_in", served=True, layers=every, reason=""))
    assert {m.address for m in wrong} == {f"q_norm_in.{i}" for i in every}
    assert all("claimed served, but refused" in m.problem for m in wrong)
    # A served point claimed refused.
    wrong = check_claims(model, _flip(claims, "lm_head", served=False, reason="fused away"))
    assert [m.address for m in wrong] == ["lm_head"]
    # A refusal shown with a reason the backend does not give.
    wrong = check_claims(model, _flip(claims, "resid_streams", reason="not implemented yet"))
    assert {m.address for m in wrong} == {f"resid_streams.{i}" for i in every}
    # A capture-only point claimed writable, and a writable point claimed capture-only.
    wrong = check_claims(model, _flip(claims, "lm_head", writable=True))
    assert [m.address for m in wrong] == ["lm_head"] and "write was refused" in wrong[0].problem
    wrong = check_claims(model, _flip(claims, "resid_post", writable=False))
    assert [m.address for m in wrong] == ["resid_post.0"]
    assert "write was accepted" in wrong[0].problem
    # A point served on some layers only, claimed on every layer.
    moe = eager("qwen3-moe")
    moe_claims = dashboard_claims(dashboard, "qwen3-moe", "eager")
    assert moe_claims["router_logits"].layers == (1, 2, 3)
    wrong = check_claims(moe, _flip(moe_claims, "router_logits", layers=(0, 1, 2, 3)))
    assert [m.address for m in wrong] == ["router_logits.0"]


@pytest.mark.parametrize("family", sorted(SYNTHETIC))
def test_committed_eager_answers_equal_the_resolver(family: str) -> None:
    committed = load_capabilities("eager")
    assert committed is not None, "run `ie points --sweep --backend eager`"
    assert committed.for_family(family) == eager(family).capabilities(), (
        f"eager.json is stale for {family}; run `ie points --sweep --backend eager --family {family}`"
    )


def _vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _vllm_available(), reason="vLLM is not installed")
# vllm-static's cards follow hooked vLLM's (packages/ie-core/tests/test_static_capabilities.py);
# its engine check is long form only (one more compiled engine).
@pytest.mark.parametrize("backend", ["vllm", pytest.param("vllm-static", marks=pytest.mark.full)])
def test_vllm_cards_equal_what_vllm_does_on_llama(dashboard: Database, backend: str) -> None:
    """One engine per backend (llama): its own answer holds, and so do the cards where the
    committed sweep answered (else the cards claim nothing)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    model = load_model("ie-synthetic/llama", backend=backend, **load_kwargs(backend))
    try:
        live = model.capabilities()
        assert check_claims(model, live) == []
        assert any(c.served for c in live.values())
        cards = dashboard_claims(dashboard, "llama", backend)
        if cards:
            assert check_claims(model, cards) == []
            assert {k: c.served for k, c in cards.items()} == {k: c.served for k, c in live.items()}
    finally:
        run(model.shutdown())
