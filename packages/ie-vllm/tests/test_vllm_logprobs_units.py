"""vLLM's per-step logprob dicts turned into StepLogprobs, without an engine."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from ie_vllm.host.logprobs import step, steps


@dataclass
class _Lp:  # the two fields of vllm.logprobs.Logprob the conversion reads
    logprob: float
    rank: int | None


@dataclass
class _Completion:
    token_ids: list[int]
    logprobs: list[dict[int, _Lp]] | None


def test_top_k_by_rank_and_a_sampled_token_outside_it() -> None:
    entry = {9: _Lp(-3.0, 4), 2: _Lp(-0.5, 1), 5: _Lp(-1.0, 2), 7: _Lp(-2.0, 3)}
    out = step(entry, 9, 3)  # the sampled token ranks 4th: vLLM adds it beside the top 3
    assert out.token_id == 9 and out.logprob == -3.0
    assert out.top_ids == (2, 5, 7) and out.top_logprobs == (-0.5, -1.0, -2.0)
    assert step(entry, 9, 0).top_ids == ()


def test_missing_logprobs_are_an_error_not_an_empty_answer() -> None:
    with pytest.raises(RuntimeError, match="sampled token"):
        step({2: _Lp(-0.5, 1)}, 9, 1)
    with pytest.raises(RuntimeError, match="1 of 2"):
        steps(_Completion([2, 3], [{2: _Lp(-0.5, 1)}]), 1)
    two = _Completion([2, 3], [{2: _Lp(-0.5, 1)}, {3: _Lp(-0.1, 1)}])
    assert [s.token_id for s in steps(two, 1, start=1)] == [3]
