"""lm-evaluation-harness model `interp-engine`: any backend, with an interventions file.

    lm_eval --model interp-engine --model_args pretrained=MODEL,backend=vllm,interventions=F.json

lm-eval (0.4.x) finds models in its own registry only (no entry-point discovery), so this module
registers itself on import: `python -m ie_evals.lm_eval_cli ...` (the `lm_eval` command with this
import done first) or `import ie_evals.lm_eval_model` before `lm_eval.simple_evaluate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ie_core import InterpModel, SamplingParams, Steering, load_model
from ie_core.errors import BadPromptError
from ie_core.runner import run
from ie_core.sync import unwrap
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from ie_evals.arguments import LOAD_ARGS, EvalArgumentError, positive_int
from ie_evals.interventions import check_interventions, load_interventions
from ie_evals.scoring import generate_continuations, rolling_windows, score_continuations

# lm-eval's own default context length (its HF model's), used when the model states none.
DEFAULT_MAX_LENGTH = 2048
# Requests handed to the backend at once: all of a task's requests would be in flight together,
# but their captured rows would then all be held at once too.
DEFAULT_IN_FLIGHT = 256
# Arguments lm-eval passes to every model: the backend batches by itself (every request in
# flight) and places the model itself (eager: CUDA when torch sees it), so they are not used;
# lm-eval's --device defaults to cuda:0 even on a CPU-only machine.
HARNESS_ARGS = ("batch_size", "max_batch_size", "device")
GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature", "top_k", "top_p", "seed")


class InterpEngineLM(TemplateLM):
    """An interp-engine model in lm-eval: `loglikelihood`, `loglikelihood_rolling` and
    `generate_until`, each request steered by the interventions file."""

    def __init__(
        self,
        pretrained: str | None = None,
        backend: str = "auto",
        interventions: str | None = None,
        max_length: int | None = None,
        prefix_token_id: int | None = None,
        max_in_flight: int = DEFAULT_IN_FLIGHT,
        model: Any = None,
        steering: Sequence[Steering] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        unknown = sorted(set(kwargs) - set(HARNESS_ARGS) - set(LOAD_ARGS))
        if unknown:
            known = ["pretrained", "backend", "interventions", "max_length", "prefix_token_id"]
            raise EvalArgumentError(
                f"unknown interp-engine model_args {unknown}; known: {known + list(LOAD_ARGS)}"
            )
        if (pretrained is None) == (model is None):
            raise EvalArgumentError("give pretrained=MODEL (or, in Python, model=a loaded model)")
        if interventions is not None and steering is not None:
            raise EvalArgumentError("give interventions=FILE or steering=specs, not both")
        # Read the file first: a malformed one is refused before a model is loaded.
        specs = load_interventions(interventions) if interventions is not None else ()
        self.steering: tuple[Steering, ...] = tuple(steering or specs)
        self.max_in_flight = positive_int(max_in_flight, "max_in_flight") or DEFAULT_IN_FLIGHT
        load_kw = {k: v for k, v in kwargs.items() if k in LOAD_ARGS}
        self.model: InterpModel = (
            unwrap(model) if model is not None else load_model(str(pretrained), backend, **load_kw)
        )
        check_interventions(self.model, self.steering, interventions or "steering")
        self._max_length = positive_int(max_length, "max_length") or _model_limit(self.model)
        self._prefix = positive_int(prefix_token_id, "prefix_token_id")

    # -- what TemplateLM asks --

    @property
    def eot_token_id(self) -> int:
        eos = getattr(getattr(self.model, "tokenizer", None), "eos_token_id", None)
        return eos if isinstance(eos, int) else self.prefix_token_id

    @property
    def prefix_token_id(self) -> int:
        """What an empty context and a rolling window's start are conditioned on: as lm-eval's HF
        model, the tokenizer's BOS, else its EOS (remote: the BOS the server states)."""
        if self._prefix is not None:
            return self._prefix
        tok = getattr(self.model, "tokenizer", None)
        info = getattr(self.model, "info", None)
        for token in (
            getattr(tok, "bos_token_id", None),
            getattr(info, "bos_token_id", None),
            getattr(tok, "eos_token_id", None),
        ):
            if isinstance(token, int):
                return token
        raise EvalArgumentError(
            f"{self.model.model_id} states no BOS or EOS token to condition an empty context on; "
            "give model_args prefix_token_id=ID"
        )

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def tokenizer_name(self) -> str:
        return self.model.model_id.replace("/", "__")

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **kwargs: Any
    ) -> list[int]:
        return self.model.to_tokens(
            string, prepend_bos=False if add_special_tokens is False else None
        )

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        return self.model.apply_chat_template(
            chat_history, add_generation_prompt=add_generation_prompt
        )

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        tok = getattr(self.model, "tokenizer", None)
        return getattr(tok, "chat_template", None) if chat_template else None

    def _loglikelihood_tokens(
        self, requests: list[tuple[tuple[str, str], list[int], list[int]]], **kwargs: Any
    ) -> list[tuple[float, bool]]:
        pairs = [self._fit(ctx, cont) for _, ctx, cont in requests]
        out: list[tuple[float, bool]] = []
        for lo in range(0, len(pairs), self.max_in_flight):
            chunk = pairs[lo : lo + self.max_in_flight]
            scored = run(score_continuations(self.model, chunk, self.steering))
            out.extend((s.logprob, s.is_greedy) for s in scored)
        for (key, _, _), result in zip(requests, out, strict=True):
            self.cache_hook.add_partial("loglikelihood", key, result)
        return out

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        windows: list[tuple[list[int], list[int]]] = []
        owner: list[int] = []
        for i, req in enumerate(requests):
            (text,) = req.args
            ids = self.tok_encode(text, add_special_tokens=False)
            for w in rolling_windows(ids, self.prefix_token_id, self.max_length):
                windows.append(w)
                owner.append(i)
        totals = [0.0] * len(requests)
        for lo in range(0, len(windows), self.max_in_flight):
            chunk = windows[lo : lo + self.max_in_flight]
            scored = run(score_continuations(self.model, chunk, self.steering))
            for i, s in zip(owner[lo : lo + self.max_in_flight], scored, strict=True):
                totals[i] += s.logprob
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", (req.args[0],), total)
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        jobs = [self._generation(*req.args) for req in requests]
        out: list[str] = []
        for lo in range(0, len(jobs), self.max_in_flight):
            chunk = jobs[lo : lo + self.max_in_flight]
            out.extend(
                run(
                    generate_continuations(
                        self.model,
                        [j[0] for j in chunk],
                        [j[1] for j in chunk],
                        [j[2] for j in chunk],
                        self.steering,
                    )
                )
            )
        for req, text in zip(requests, out, strict=True):
            self.cache_hook.add_partial("generate_until", req.args, text)
        return out

    # -- helpers --

    def _fit(self, context: list[int], continuation: list[int]) -> tuple[list[int], list[int]]:
        """The pair cut from the left to `max_length` positions, as lm-eval's HF model does."""
        if len(continuation) >= self.max_length:
            raise BadPromptError(
                f"a continuation of {len(continuation)} tokens does not fit max_length="
                f"{self.max_length} positions after a context token; raise max_length"
            )
        keep = self.max_length - len(continuation)
        return context[-keep:], continuation

    def _generation(
        self, context: str, gen_kwargs: dict[str, Any]
    ) -> tuple[list[int], SamplingParams, list[str]]:
        options = dict(gen_kwargs or {})
        unknown = sorted(set(options) - set(GEN_KWARGS))
        if unknown:
            raise EvalArgumentError(
                f"unknown generation options {unknown} for interp-engine; known: {list(GEN_KWARGS)}"
            )
        until = options.get("until") or []
        stops = [until] if isinstance(until, str) else list(until)
        if not all(isinstance(s, str) for s in stops):
            raise EvalArgumentError(f"until must be a string or a list of strings, got {until!r}")
        max_new = positive_int(options.get("max_gen_toks", 256), "max_gen_toks") or 256
        temperature = float(options.get("temperature", 0.0) or 0.0)
        # As lm-eval's HF model: sampling when asked, or when a temperature above 0 is given.
        sample = bool(options.get("do_sample", temperature > 0.0))
        temperature = (temperature or 1.0) if sample else 0.0
        sampling = SamplingParams(
            max_new_tokens=max_new,
            temperature=temperature,
            top_k=int(options.get("top_k", 0) or 0) if sample else 0,
            top_p=float(options.get("top_p", 1.0) or 1.0) if sample else 1.0,
            seed=options.get("seed"),
        )
        ids = self.tok_encode(context)
        keep = self.max_length - max_new
        if keep < 1:
            raise BadPromptError(
                f"max_gen_toks={max_new} leaves no room for the prompt in max_length="
                f"{self.max_length}; lower max_gen_toks or raise max_length"
            )
        return ids[-keep:], sampling, stops


# Registered by a call, not as a decorator: the decorator's untyped return hides the constructor's
# signature from type checkers.
register_model("interp-engine")(InterpEngineLM)


def _model_limit(model: Any) -> int:
    """The positions the model states (eager: its config), else lm-eval's default."""
    limit = getattr(model, "max_positions", None) or getattr(model, "max_model_len", None)
    return int(limit) if isinstance(limit, int) and limit > 1 else DEFAULT_MAX_LENGTH


__all__ = ["EvalArgumentError", "InterpEngineLM"]
