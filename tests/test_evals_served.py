"""ie-evals against hooked vLLM, through the session's one `ie serve` of ie-synthetic/llama
(tests/conftest.py's `llama_server`: no engine of its own): the lm-eval model with
`backend=remote` and the Inspect provider with `base_url`, plain and steered.

References: a plain Hugging Face forward of the same synthetic weights with a hook written in
evals_support (log-likelihoods within 1e-4 of the log-probability's scale: vLLM against HF), HF
greedy decoding by full forwards (generated tokens exactly), and the in-process eager runs of the
same tasks (the same accuracies and completions)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("lm_eval")
pytest.importorskip("inspect_ai")

# ie-evals' test helpers, by path: that folder is on sys.path only when its own tests run too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages/ie-evals/tests"))
from evals_support import CHOICES, QUESTIONS, close, hf_logprob, split_pair, write_mc_task
from ie_core import Additive, load_model, steer_at
from ie_evals import write_interventions
from ie_evals.lm_eval_model import InterpEngineLM
from lm_eval.api.instance import Instance
from serve_process import LLAMA, LLAMA_KEY

pytestmark = [pytest.mark.slow]

TOL_VLLM = 1e-4
LAYER = 1
PAIRS = [
    ("The capital of France is", " Paris"),
    ("Question: is it", " yes"),
    ("One two three", " four five six"),
]


@pytest.fixture(scope="module")
def ref() -> Any:
    return load_model(LLAMA, backend="eager", device="cpu", dtype="float32")


def _vector(model: Any) -> torch.Tensor:
    return torch.randn(model.d_model, generator=torch.Generator().manual_seed(3)) * 3.0


def _remote_lm(server: str, file: Path | None) -> InterpEngineLM:
    """As `--model_args pretrained=URL,backend=remote,api_key=KEY,interventions=FILE` gives it."""
    extra: dict[str, Any] = {"interventions": str(file)} if file is not None else {}
    return InterpEngineLM(pretrained=server, backend="remote", api_key=LLAMA_KEY, **extra)


@pytest.mark.parametrize("steered", [False, True])
def test_lm_eval_on_served_vllm_equals_hf_by_hand(
    llama_server: str, ref: Any, tmp_path: Path, steered: bool
) -> None:
    vector = _vector(ref) if steered else None
    file = None
    if vector is not None:
        file = write_interventions(
            tmp_path / "s.json", steer_at(f"resid_post.{LAYER}", Additive(vector))
        )
    lm = _remote_lm(llama_server, file)
    got = lm.loglikelihood([Instance("loglikelihood", {}, p, i) for i, p in enumerate(PAIRS)])
    for (ctx, cont), (logprob, _) in zip(PAIRS, got, strict=True):
        want, _ = hf_logprob(ref.hf_model, *split_pair(ref.tokenizer, ctx, cont), vector, LAYER)
        assert close(logprob, want, TOL_VLLM), (ctx, cont, logprob, want)
    text = "The capital of France is Paris, and the capital of Japan is Tokyo."
    (rolling,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    ids = ref.tokenizer(text, add_special_tokens=False)["input_ids"]
    want, _ = hf_logprob(ref.hf_model, [ref.tokenizer.bos_token_id], ids, vector, LAYER)
    assert close(rolling, want, TOL_VLLM)
    # generate_until: the eager model's generate_until through the same file (its tokens are
    # checked against HF greedy in test_lm_eval_eager).
    eager = InterpEngineLM(model=ref, interventions=str(file) if file else None)
    req = [
        Instance("generate_until", {}, (p, {"until": ["never"], "max_gen_toks": 6}), i)
        for i, (p, _) in enumerate(PAIRS)
    ]
    assert lm.generate_until(req) == eager.generate_until(req)


@pytest.mark.full  # simple_evaluate's own cost; eager's task test and the numbers above cover it
def test_local_task_accuracy_served_equals_eager(
    llama_server: str, ref: Any, tmp_path: Path
) -> None:
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.tasks import TaskManager

    tok, hf = ref.tokenizer, ref.hf_model
    docs = [
        {"question": q, "choices": list(CHOICES), "answer": 0}
        for q in QUESTIONS
        if hf_logprob(hf, *split_pair(tok, q, CHOICES[0]))[0]
        > hf_logprob(hf, *split_pair(tok, q, CHOICES[1]))[0]
    ]
    a, b = (split_pair(tok, QUESTIONS[0], c)[1][-1] for c in CHOICES)
    w = hf.lm_head.weight.detach()
    vector = (w[b] - w[a]) / (w[b] - w[a]).norm() * 200.0
    last = ref.n_layers - 1
    file = write_interventions(
        tmp_path / "b.json", steer_at(f"resid_post.{last}", Additive(vector))
    )
    task = write_mc_task(tmp_path, "ie_letters_served", docs)
    manager = TaskManager(include_path=str(tmp_path), include_defaults=False)
    accs = []
    for lm in (_remote_lm(llama_server, None), _remote_lm(llama_server, file)):
        out: Any = simple_evaluate(lm, tasks=[task], task_manager=manager)
        accs.append(out["results"][task]["acc,none"])
    assert accs == [1.0, 0.0]  # the plain run is the negative control


def test_inspect_against_ie_serve_scores_as_in_process(
    llama_server: str, ref: Any, tmp_path: Path
) -> None:
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import GenerateConfig, get_model
    from inspect_ai.scorer import includes

    file = write_interventions(
        tmp_path / "s.json", steer_at(f"resid_post.{LAYER}", Additive(_vector(ref)))
    )
    prompts = ["The capital of France is", "One two three", "Question: is it"]
    config = GenerateConfig(max_tokens=6)
    results = {}
    runs: list[tuple[str, dict[str, Any]]] = [
        ("served", {"base_url": llama_server, "api_key": LLAMA_KEY}),
        ("eager", {"ie_model": ref}),
    ]
    for where, args in runs:
        for steered in (False, True):
            extra: dict[str, Any] = {"interventions": str(file)} if steered else {}
            model = get_model(
                f"interp-engine/{LLAMA}", config=config, memoize=False, **args, **extra
            )
            # Targets: letters the texts may or may not include; the score and texts must agree.
            task = Task(dataset=[Sample(input=p, target="a") for p in prompts], scorer=includes())
            log: Any
            (log,) = inspect_eval(task, model=model, log_dir=str(tmp_path / where), display="none")
            assert log.status == "success" and log.samples is not None
            results[where, steered] = (
                log.results.scores[0].metrics["accuracy"].value,
                [s.output.completion for s in log.samples],
            )
    for steered in (False, True):
        assert results["served", steered] == results["eager", steered]
    assert results["eager", False][1] != results["eager", True][1]
