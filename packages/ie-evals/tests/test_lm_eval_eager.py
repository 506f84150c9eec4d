"""The lm-eval model `interp-engine` on eager (ie-synthetic/llama, fp32 CPU) against a plain
Hugging Face forward of the same weights (evals_support.hf_logprob: its own hook, its own
log-softmax), plain and steered, 1e-5 relative to the log-probability's scale; generate_until
against greedy decoding by repeated full HF forwards; a local multiple-choice task (YAML + jsonl
written here) whose steered accuracy must differ from the plain one; and the named refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("lm_eval")

from evals_support import (
    CHOICES,
    QUESTIONS,
    close,
    hf_logprob,
    split_pair,
    write_mc_task,
)
from ie_core import Additive, SamplingParams, load_model, steer_at
from ie_core.runner import run
from ie_evals import InterventionsFileError, write_interventions
from ie_evals.lm_eval_model import EvalArgumentError, InterpEngineLM
from ie_evals.scoring import cut_at_stops, rolling_windows
from lm_eval.api.instance import Instance

TOL = 1e-5
LAYER = 1
PAIRS = [
    ("The capital of France is", " Paris"),
    ("Question: is it", " yes"),
    ("Question: is it", " no"),
    ("One two three", " four five six"),
]


@pytest.fixture(scope="module")
def model() -> Any:
    return load_model("ie-synthetic/llama", backend="eager", device="cpu", dtype="float32")


def _vector(model: Any) -> torch.Tensor:
    # Large against the synthetic residual (norm ~10): every log-prob moves by far more than TOL.
    return torch.randn(model.d_model, generator=torch.Generator().manual_seed(3)) * 3.0


def _steered_file(model: Any, folder: Path) -> Path:
    spec = steer_at(f"resid_post.{LAYER}", Additive(_vector(model)))
    return write_interventions(folder / "steer.json", spec)


def _ll(lm: InterpEngineLM, pairs: list[tuple[str, str]]) -> list[tuple[float, bool]]:
    return lm.loglikelihood([Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)])


class _Forwards:
    """Counts forwards of the HF model (a refusal must come before any)."""

    def __init__(self, model: Any) -> None:
        self.n = 0
        self.handle = model.hf_model.register_forward_pre_hook(self._count)

    def _count(self, *_: Any) -> None:
        self.n += 1


@pytest.mark.parametrize("steered", [False, True])
def test_loglikelihood_equals_hf_forward_by_hand(model: Any, tmp_path: Path, steered: bool) -> None:
    file = _steered_file(model, tmp_path) if steered else None
    lm = InterpEngineLM(model=model, interventions=str(file) if file else None)
    got = _ll(lm, PAIRS)
    vector = _vector(model) if steered else None
    for (ctx, cont), (logprob, greedy) in zip(PAIRS, got, strict=True):
        want, want_greedy = hf_logprob(
            model.hf_model, *split_pair(model.tokenizer, ctx, cont), vector, LAYER
        )
        assert close(logprob, want, TOL), (ctx, cont, logprob, want)
        assert greedy == want_greedy
    # Negative control: the other run's reference is far from these numbers.
    other = None if steered else _vector(model)
    ctx, cont = PAIRS[0]
    wrong, _ = hf_logprob(model.hf_model, *split_pair(model.tokenizer, ctx, cont), other, LAYER)
    assert not close(got[0][0], wrong, 1e-2)


def test_loglikelihood_rolling_equals_hf_forward_by_hand(model: Any) -> None:
    lm = InterpEngineLM(model=model)
    text = "The capital of France is Paris, and the capital of Japan is Tokyo."
    (got,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    ids = model.tokenizer(text, add_special_tokens=False)["input_ids"]
    bos = model.tokenizer.bos_token_id  # lm-eval's HF model's prefix: BOS where there is one
    want, _ = hf_logprob(model.hf_model, [bos], ids)
    assert close(got, want, TOL)
    # Windows of 8 positions: a different (shorter-context) sum, so the windows are really used.
    short = InterpEngineLM(model=model, max_length=8)
    (windowed,) = short.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    parts = [hf_logprob(model.hf_model, c, x)[0] for c, x in rolling_windows(ids, bos, 8)]
    assert close(windowed, sum(parts), TOL)
    assert not close(windowed, want, 1e-3)


def test_rolling_windows_score_each_token_once_with_the_most_context() -> None:
    ids = list(range(10, 31))  # 21 tokens
    windows = rolling_windows(ids, 0, 8)
    assert [t for _, x in windows for t in x] == ids
    tokens = [0, *ids]
    for ctx, cont in windows:
        assert len(ctx) + len(cont) <= 8 and ctx
        start = tokens.index(cont[0])
        assert ctx == tokens[max(0, start + len(cont) - 8) : start]  # the most context that fits


def _hf_greedy(model: Any, ids: list[int], n: int, vector: torch.Tensor | None) -> list[int]:
    """Greedy tokens by a full forward of the whole sequence per step (no KV cache)."""
    out: list[int] = []
    eos = model.tokenizer.eos_token_id
    for _ in range(n):
        logits_row = _last_logits(model, [*ids, *out], vector)
        token = int(logits_row.argmax())
        if token == eos:
            break
        out.append(token)
    return out


def _last_logits(model: Any, ids: list[int], vector: torch.Tensor | None) -> torch.Tensor:
    def add(module: torch.nn.Module, args: tuple, output: Any) -> Any:
        return output + vector

    block = model.hf_model.model.layers[LAYER]
    handle = block.register_forward_hook(add) if vector is not None else None
    try:
        with torch.no_grad():
            return model.hf_model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
    finally:
        if handle is not None:
            handle.remove()


@pytest.mark.parametrize("steered", [False, True])
def test_generate_until_equals_generate_and_hf_greedy(
    model: Any, tmp_path: Path, steered: bool
) -> None:
    file = _steered_file(model, tmp_path) if steered else None
    lm = InterpEngineLM(model=model, interventions=str(file) if file else None)
    prompts = ["The capital of France is", "One two three"]
    vector = _vector(model) if steered else None
    spec = steer_at(f"resid_post.{LAYER}", Additive(vector)) if vector is not None else None
    fulls = []
    for prompt in prompts:
        ids = model.to_tokens(prompt)
        gen = run(model.generate(ids, SamplingParams(max_new_tokens=6), steering=spec))
        assert list(gen.token_ids) == _hf_greedy(model, ids, 6, vector)
        fulls.append(gen.text)
    stop = fulls[0][2:4]  # a stop string inside the first text (so the cut is tested)
    kwargs = {"until": [stop, "never"], "max_gen_toks": 6, "do_sample": False}
    reqs = [Instance("generate_until", {}, (p, dict(kwargs)), i) for i, p in enumerate(prompts)]
    got = lm.generate_until(reqs)
    assert got[0] == fulls[0][: fulls[0].index(stop)]
    assert got == [cut_at_stops(full, [stop]) for full in fulls]


def _letter_docs(model: Any) -> tuple[list[dict[str, Any]], torch.Tensor]:
    """Questions whose plain model prefers " A" (by hand), and a vector at the last block that
    pushes " B" over " A": the plain run must score 1.0 and the steered run 0.0."""
    tok, hf = model.tokenizer, model.hf_model
    docs = []
    for q in QUESTIONS:
        scores = [hf_logprob(hf, *split_pair(tok, q, c))[0] for c in CHOICES]
        if scores[0] > scores[1]:
            docs.append({"question": q, "choices": list(CHOICES), "answer": 0})
    assert len(docs) >= 3, "too few questions where the plain model prefers ' A'"
    a = split_pair(tok, QUESTIONS[0], CHOICES[0])[1][-1]
    b = split_pair(tok, QUESTIONS[0], CHOICES[1])[1][-1]
    w = hf.lm_head.weight.detach()
    direction = w[b] - w[a]
    return docs, direction / direction.norm() * 200.0


def _accuracy(lm: InterpEngineLM, folder: Path, task: str) -> tuple[float, list[Any]]:
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(folder), include_defaults=False)
    out: Any = simple_evaluate(lm, tasks=[task], task_manager=manager, log_samples=True)
    return out["results"][task]["acc,none"], out["samples"][task]


def test_local_task_steered_accuracy_differs_from_plain(model: Any, tmp_path: Path) -> None:
    docs, vector = _letter_docs(model)
    task = write_mc_task(tmp_path, "ie_letters", docs)
    last = model.n_layers - 1
    file = write_interventions(
        tmp_path / "b.json", steer_at(f"resid_post.{last}", Additive(vector))
    )
    plain, plain_samples = _accuracy(InterpEngineLM(model=model), tmp_path, task)
    steered, steered_samples = _accuracy(
        InterpEngineLM(model=model, interventions=str(file)), tmp_path, task
    )
    assert plain == 1.0  # negative control: the task is built so the plain model passes it
    assert steered == 0.0
    # Each sample's log-likelihoods are the hand numbers of its own run.
    for samples, vec in ((plain_samples, None), (steered_samples, vector)):
        for sample in samples:
            question = sample["doc"]["question"]
            for choice, resp in zip(CHOICES, sample["resps"], strict=True):
                want, _ = hf_logprob(
                    model.hf_model, *split_pair(model.tokenizer, question, choice), vec, last
                )
                assert close(float(resp[0][0]), want, TOL)


def test_the_registered_name_and_a_model_args_string(model: Any, tmp_path: Path) -> None:
    """lm-eval's own path from `--model interp-engine --model_args ...` (registry, the args
    string), in-process: the model folder is loaded again (cached, ~0.2 s)."""
    from lm_eval.api.registry import get_model
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.tasks import TaskManager

    assert get_model("interp-engine") is InterpEngineLM
    docs, vector = _letter_docs(model)
    task = write_mc_task(tmp_path, "ie_letters_args", docs)
    last = model.n_layers - 1
    file = write_interventions(
        tmp_path / "b.json", steer_at(f"resid_post.{last}", Additive(vector))
    )
    args = f"pretrained=ie-synthetic/llama,backend=eager,dtype=float32,interventions={file}"
    manager = TaskManager(include_path=str(tmp_path), include_defaults=False)
    out: Any = simple_evaluate("interp-engine", args, tasks=[task], task_manager=manager)
    assert out["results"][task]["acc,none"] == 0.0


@pytest.mark.full  # a fresh interpreter (~20 s); the in-process test above covers the same path
def test_the_documented_command_runs_a_local_task(model: Any, tmp_path: Path) -> None:
    """`python -m ie_evals.lm_eval_cli run --model interp-engine ...` as USAGE gives it."""
    docs, vector = _letter_docs(model)
    task = write_mc_task(tmp_path, "ie_letters_cli", docs)
    last = model.n_layers - 1
    file = write_interventions(
        tmp_path / "b.json", steer_at(f"resid_post.{last}", Additive(vector))
    )
    out = tmp_path / "out"
    args = "pretrained=ie-synthetic/llama,backend=eager,dtype=float32,interventions=" + str(file)
    cmd = [sys.executable, "-m", "ie_evals.lm_eval_cli", "run", "--model", "interp-engine"]
    cmd += ["--model_args", args, "--tasks", task, "--include_path", str(tmp_path)]
    cmd += ["--output_path", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (result,) = out.rglob("results_*.json")
    assert json.loads(result.read_text())["results"][task]["acc,none"] == 0.0


# -- refusals, each before any forward --


def test_malformed_interventions_files_are_refused_by_name(model: Any, tmp_path: Path) -> None:
    cases = {
        "not json": "{",
        "not a list": json.dumps({"point": "resid_post"}),
        "unknown op": json.dumps([{"point": "resid_post", "layers": [1], "ops": [{"kind": "x"}]}]),
        "unknown field": json.dumps([{"point": "resid_post", "layers": [1], "ops": [], "x": 1}]),
        "missing ops": json.dumps([{"point": "resid_post", "layers": [1]}]),
        "bad vector": json.dumps(
            [{"point": "resid_post", "layers": [1], "ops": [{"kind": "additive", "vector": "v"}]}]
        ),
        "unknown point": json.dumps(
            [{"point": "resid_nope", "layers": [1], "ops": [{"kind": "scale", "factor": 2}]}]
        ),
    }
    for name, text in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.json"
        path.write_text(text)
        # The file is read before the model is loaded: a model that does not exist is never asked.
        with pytest.raises(InterventionsFileError, match=str(path)):
            InterpEngineLM(pretrained="ie-synthetic/no-such-family", interventions=str(path))
    with pytest.raises(InterventionsFileError, match="cannot read"):
        InterpEngineLM(pretrained="ie-synthetic/llama", interventions=str(tmp_path / "absent"))


def test_interventions_that_do_not_fit_the_model_are_refused_before_a_forward(
    model: Any, tmp_path: Path
) -> None:
    forwards = _Forwards(model)
    try:
        wide = write_interventions(
            tmp_path / "w.json", steer_at("resid_post.1", Additive(torch.ones(model.d_model + 1)))
        )
        with pytest.raises(InterventionsFileError, match="width"):
            InterpEngineLM(model=model, interventions=str(wide))
        deep = write_interventions(
            tmp_path / "d.json", steer_at("resid_post.9", Additive(torch.ones(model.d_model)))
        )
        with pytest.raises(InterventionsFileError, match="out of range"):
            InterpEngineLM(model=model, interventions=str(deep))
        with pytest.raises(EvalArgumentError, match="unknown interp-engine model_args"):
            InterpEngineLM(model=model, temperture=0.5)
        lm = InterpEngineLM(model=model)
        bad = Instance("generate_until", {}, ("Hi", {"until": ["\n"], "max_tokens": 3}), 0)
        with pytest.raises(EvalArgumentError, match="unknown generation options"):
            lm.generate_until([bad])
        assert forwards.n == 0
    finally:
        forwards.handle.remove()
