"""The committed vllm-static answers against the code's facts, without an engine.

vllm-static taps the hooked backend's sites (ie-vllm's resolver) at every point the registry
declares tappable (`ie_static.serving`, recorded in the committed file's `declared`; the set
`ie_static.declared.TAPPABLE` is built from the same rule), and refuses the rest with the hooked backend's reason. So on every family both
sweeps answered, the static answer is determined by the hooked answer and the registry marks;
a sweep or a registry change that breaks that shows here. The engine-level check (one compiled
engine on llama against its cards) is `tests/test_capabilities_honest.py`, marked slow.
"""

from __future__ import annotations

import dataclasses

import pytest
from ie_core.capabilities import PointCapability, declared_serving, load_capabilities
from ie_core.grammar import FAMILIES as REGISTERED
from ie_core.grammar import POINTS

STATIC = load_capabilities("vllm-static")
HOOKED = load_capabilities("vllm")
FAMILIES = sorted(slug for slug, _ in STATIC.models.values()) if STATIC else []
FAMILIES_BY_SLUG = {f.slug: f for f in REGISTERED}


# Hooked answers committed before `probe` named the refused layers of a partly served point
# ("layers 1, 2, 3: ..."): there only the reasons of partly served points may differ in form.
# Drop a family once `family_sweep.py --backend vllm --family F` is rerun and committed.
HOOKED_PARTIAL_REASONS_OLD_FORM: frozenset[str] = frozenset({"qwen2-moe"})


# Points hooked vLLM reads from two modules' outputs (ie-vllm's `SiteDef.companions`), which a
# static tap, inside one module's forward, cannot: Granite-4.0-H sums its routed and shared MLPs.
TWO_MODULE_POINTS: dict[str, frozenset[str]] = {
    "granitemoehybrid": frozenset({"mlp_out", "mlp_out_post"})
}


def _comparable(family: str, cap: PointCapability) -> PointCapability:
    if family in HOOKED_PARTIAL_REASONS_OLD_FORM and cap.served and cap.reason:
        return dataclasses.replace(cap, reason="<partly served>")
    return cap


def expected_static(name: str, hooked: PointCapability) -> PointCapability:
    """What vllm-static should answer for point `name`, given hooked vLLM's answer on a family."""
    mark = declared_serving("vllm-static", name)
    assert mark is not None, f"the committed vllm-static file declares nothing for {name}"
    if not hooked.served or mark.served:
        return hooked  # a hooked refusal is the static refusal; a hooked site is a static tap
    return PointCapability(False, False, (), f"{name} is {mark.reason}")


def test_vllm_static_was_swept_on_every_family_hooked_vllm_was() -> None:
    assert STATIC is not None and HOOKED is not None
    hooked = {slug for slug, _ in HOOKED.models.values()}
    assert hooked - set(FAMILIES) == set(), "sweep vllm-static on these families"


@pytest.mark.parametrize("family", FAMILIES)
def test_static_answer_follows_the_hooked_answer_and_the_marks(family: str) -> None:
    assert STATIC is not None and HOOKED is not None
    static, hooked = STATIC.for_family(family), HOOKED.for_family(family)
    assert static is not None and hooked is not None, family
    assert set(static) == {p.name for p in POINTS}
    two_module = TWO_MODULE_POINTS.get(family, frozenset())
    for name in two_module:
        assert hooked[name].served and not static[name].served, (family, name)
        assert static[name].reason.startswith(f"{name} is the sum of two modules"), static[name]
    wrong = {
        name: (static[name], expected_static(name, hooked[name]))
        for name in static
        if name not in two_module
        and _comparable(family, static[name])
        != _comparable(family, expected_static(name, hooked[name]))
    }
    assert wrong == {}, f"{family}: committed vllm-static answer vs expected"


def test_negative_control_a_dropped_tap_is_caught() -> None:
    """A tappable point the hooked backend serves, answered refused, differs from the expected."""
    assert HOOKED is not None
    hooked = HOOKED.for_family("llama")
    assert hooked is not None
    dropped = PointCapability(False, False, (), "not tapped")
    assert expected_static("z", hooked["z"]) == hooked["z"] != dropped
    assert not expected_static("lm_head", hooked["lm_head"]).served
