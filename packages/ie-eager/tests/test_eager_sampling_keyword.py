"""The sampling keyword is `sampling` on eager as in the protocol (and on vllm, vllm-static,
remote); eager's old `sampling_params=` still works, with a DeprecationWarning."""

from __future__ import annotations

import pytest
from eager_support import PROMPT, synthetic_model
from ie_core.protocol import SamplingParams
from ie_core.runner import run

PARAMS = SamplingParams(max_new_tokens=4, stop_at_eos=False)


def test_sampling_keyword_and_the_deprecated_old_name_agree() -> None:
    model = synthetic_model("llama")
    ids = model.to_tokens(PROMPT)
    by_new = run(model.generate(ids, sampling=PARAMS)).token_ids
    assert len(by_new) == 4  # negative control: the keyword reached the decode loop
    with pytest.warns(DeprecationWarning, match="sampling="):
        by_old = run(model.generate(ids, sampling_params=PARAMS)).token_ids
    assert by_old == by_new

    async def stream() -> list[int]:
        return [c.token_id async for c in model.generate_stream(ids, sampling=PARAMS)]

    assert tuple(run(stream())) == by_new
    result = run(model.capture_generation(ids, ["resid_post.1"], sampling=PARAMS))
    assert result.generation.token_ids == by_new
