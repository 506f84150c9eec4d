"""The Inspect AI provider `interp-engine/MODEL` in-process on eager (ie-synthetic/llama, fp32 CPU):
found through its `inspect_ai` entry point (this file never imports the registering module), a
local eval end to end whose targets are the plain model's greedy texts (greedy tokens checked
against repeated full HF forwards), so the plain run scores 1.0 and the steered run, whose texts
are its own greedy texts, scores 0.0; and the named refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("inspect_ai")

from ie_core import Additive, SamplingParams, load_model, steer_at
from ie_core.errors import LayerOutOfRangeError, UnsupportedOperationError
from ie_core.runner import run
from ie_evals import write_interventions
from ie_evals.arguments import EvalArgumentError
from ie_evals.inspect_provider import messages_text
from ie_evals.sample_captures import CapturesUnavailableError, clear_captures, sample_captures
from inspect_ai import Task
from inspect_ai import eval as inspect_eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ChatMessageUser, GenerateConfig, get_model
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import TaskState, generate

LAYER = 1
MAX_TOKENS = 6
PROMPTS = ["The capital of France is", "One two three", "Question: is it"]


@pytest.fixture(scope="module")
def model() -> Any:
    return load_model("ie-synthetic/llama", backend="eager", device="cpu", dtype="float32")


def _vector(model: Any) -> torch.Tensor:
    return torch.randn(model.d_model, generator=torch.Generator().manual_seed(3)) * 3.0


@scorer(metrics=[accuracy()])
def same_text() -> Any:
    """CORRECT when the completion is the target, character for character."""

    async def score(state: TaskState, target: Target) -> Score:
        ok = state.output.completion == target.text
        return Score(value=CORRECT if ok else INCORRECT, answer=state.output.completion)

    return score


def _greedy_text(model: Any, prompt: str, spec: Any) -> tuple[str, list[int], int]:
    """(text, prompt + generated ids, generated count) of the engine's greedy generation."""
    text = messages_text(model, [ChatMessageUser(content=prompt)])
    ids = model.to_tokens(text)
    gen = run(model.generate(ids, SamplingParams(max_new_tokens=MAX_TOKENS), steering=spec))
    return gen.text, [*ids, *gen.token_ids], len(gen.token_ids)


def _hf_greedy_ok(model: Any, sequence: list[int], n_new: int, vector: Any) -> bool:
    """Each generated token is the argmax of a full HF forward over the tokens before it."""

    def add(module: torch.nn.Module, args: tuple, output: Any) -> Any:
        return output + vector

    block = model.hf_model.model.layers[LAYER]
    handle = block.register_forward_hook(add) if vector is not None else None
    try:
        with torch.no_grad():
            logits = model.hf_model(input_ids=torch.tensor([sequence]), use_cache=False).logits[0]
    finally:
        if handle is not None:
            handle.remove()
    start = len(sequence) - n_new
    return bool((logits[start - 1 : -1].argmax(-1) == torch.tensor(sequence[start:])).all())


def _run(model: Any, targets: list[str], log_dir: Path, **args: Any) -> Any:
    task = Task(
        dataset=[Sample(input=p, target=t) for p, t in zip(PROMPTS, targets, strict=True)],
        solver=generate(),
        scorer=same_text(),
    )
    inspect_model = get_model(
        "interp-engine/ie-synthetic/llama",
        config=GenerateConfig(max_tokens=MAX_TOKENS),
        memoize=False,
        ie_model=model,
        **args,
    )
    (log,) = inspect_eval(task, model=inspect_model, log_dir=str(log_dir), display="none")
    return log


def test_local_eval_end_to_end_plain_and_steered(model: Any, tmp_path: Path) -> None:
    vector = _vector(model)
    spec = steer_at(f"resid_post.{LAYER}", Additive(vector))
    file = write_interventions(tmp_path / "steer.json", spec)
    plain, steered = [], []
    for prompt in PROMPTS:
        for out, s, v in ((plain, None, None), (steered, spec, vector)):
            text, sequence, n_new = _greedy_text(model, prompt, s)
            assert _hf_greedy_ok(model, sequence, n_new, v)
            out.append(text)
    assert plain != steered  # else the steered run could not score differently
    plain_log = _run(model, plain, tmp_path / "plain")
    steered_log = _run(model, plain, tmp_path / "steered", interventions=str(file))
    assert plain_log.status == "success" and steered_log.status == "success"
    acc = [log.results.scores[0].metrics["accuracy"].value for log in (plain_log, steered_log)]
    assert acc[0] == 1.0
    assert acc[1] == sum(p == s for p, s in zip(plain, steered, strict=True)) / len(PROMPTS)
    assert acc[1] < 1.0
    assert steered_log.samples is not None
    got = {s.input: s.output.completion for s in steered_log.samples}
    assert [got[p] for p in PROMPTS] == steered


def test_refusals(model: Any, tmp_path: Path) -> None:
    with pytest.raises(EvalArgumentError, match="unknown interp-engine model args"):
        get_model("interp-engine/ie-synthetic/llama", memoize=False, ie_model=model, layer=3)
    api = get_model("interp-engine/ie-synthetic/llama", memoize=False, ie_model=model).api
    with pytest.raises(EvalArgumentError, match="num_choices"):
        run(
            api.generate([ChatMessageUser(content="Hi")], [], "auto", GenerateConfig(num_choices=2))
        )
    from inspect_ai.tool import ToolInfo

    tool = ToolInfo(name="t", description="a tool")
    with pytest.raises(UnsupportedOperationError, match="tools"):
        run(api.generate([ChatMessageUser(content="Hi")], [tool], "auto", GenerateConfig()))


def test_a_scorer_reads_the_samples_captures(model: Any, tmp_path: Path) -> None:
    """`capture=` keeps each sample's rows (prompt + generated[:-1]) for its scorer; they equal
    HF's own hidden states of that sequence (block LAYER's output), 1e-5 of their scale."""
    seen: dict[str, torch.Tensor] = {}

    @scorer(metrics=[accuracy()])
    def reads_rows() -> Any:
        async def score(state: TaskState, target: Target) -> Score:
            rows = sample_captures(state)[f"resid_post.{LAYER}"]
            seen[state.input_text] = rows
            return Score(value=CORRECT)

        return score

    task = Task(dataset=[Sample(input=p, target="") for p in PROMPTS], scorer=reads_rows())
    inspect_model = get_model(
        "interp-engine/ie-synthetic/llama",
        config=GenerateConfig(max_tokens=MAX_TOKENS),
        memoize=False,
        ie_model=model,
        capture=f"resid_post.{LAYER}",
    )
    (log,) = inspect_eval(task, model=inspect_model, log_dir=str(tmp_path), display="none")
    assert log.status == "success" and sorted(seen) == sorted(PROMPTS)
    for prompt in PROMPTS:
        _, sequence, _ = _greedy_text(model, prompt, None)
        with torch.no_grad():
            hidden = model.hf_model(
                input_ids=torch.tensor([sequence[:-1]]), output_hidden_states=True
            ).hidden_states[LAYER + 1][0]
        rows = seen[prompt].reshape(hidden.shape)
        assert torch.allclose(rows, hidden, atol=1e-5 * float(hidden.abs().max()))
    clear_captures()
    with pytest.raises(CapturesUnavailableError, match="no longer held"):
        sample_captures(log.samples[0] if log.samples else None)
    plain = get_model("interp-engine/ie-synthetic/llama", memoize=False, ie_model=model)
    out = run(
        plain.api.generate(
            [ChatMessageUser(content="Hi")], [], "auto", GenerateConfig(max_tokens=2)
        )
    )
    with pytest.raises(CapturesUnavailableError, match="capture=ADDRESSES"):
        sample_captures(type("State", (), {"output": out})())
    with pytest.raises(LayerOutOfRangeError):
        get_model(
            "interp-engine/ie-synthetic/llama",
            memoize=False,
            ie_model=model,
            capture="resid_post.99",
        )
