"""`ie fit --backend vllm-static` prices the tap buffers and write tables `plan_launch` plans for
the same declaration (the launch's own numbers, no engine), and refuses what the launch refuses."""

from __future__ import annotations

import pytest
from ie_core.fit import fit
from ie_static.launch import plan_launch

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.mark.parametrize(
    ("points", "writes"),
    [((), ()), (("resid_post", "mlp_out.3"), ("resid_post.3",))],
)
def test_static_buffers_are_the_launch_plans(
    points: tuple[str, ...], writes: tuple[str, ...]
) -> None:
    report = fit(SMOLLM2, "vllm-static", points=points, static_writes=writes, max_model_len=256)
    priced = next(i.nbytes for i in report.items if i.name == "tap buffers and write tables")
    launch = plan_launch(
        SMOLLM2, list(report_addresses(points)) or "auto", list(writes) or "auto",
        slots=16, max_ops=4, masks=4, max_model_len=256,
    )  # fmt: skip
    assert priced == launch.plan.total
    # Negative control: another declaration prices differently.
    other = fit(
        SMOLLM2, "vllm-static", points=("resid_post.0",), static_writes=(), max_model_len=256
    )
    assert next(i.nbytes for i in other.items if i.name.startswith("tap")) != priced


def report_addresses(points: tuple[str, ...]) -> tuple[str, ...]:
    from ie_core.fit import model_shape, read_checkpoint
    from ie_core.fit.sizing import expand_addresses

    return expand_addresses(points, model_shape(read_checkpoint(SMOLLM2).config))


def test_a_point_static_cannot_tap_is_refused_as_the_launch_refuses() -> None:
    from ie_core.errors import PointUnavailableError

    with pytest.raises(PointUnavailableError, match="vllm-static does not serve mlp_pre"):
        fit(SMOLLM2, "vllm-static", points=("mlp_pre",), max_model_len=256)
