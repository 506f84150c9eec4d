"""Inspect AI provider `interp-engine/MODEL`: generation on any backend, every request steered by
the interventions file.

    inspect eval task.py --model interp-engine/ie-synthetic/llama -M backend=eager \
        -M interventions=steer.json
    IE_API_KEY=KEY inspect eval task.py --model interp-engine/MODEL \
        --model-base-url http://host:8000                  # against `ie serve` (backend remote)

Inspect finds the provider through the `inspect_ai` entry point (`ie_evals._inspect_registry`),
so installing `ie-evals[inspect]` is enough. `capture=` (addresses) keeps each sample's rows for
its scorers (`ie_evals.sample_captures`). Chat messages become the prompt through the model's
chat template; a tokenizer without one gets the messages' texts joined by blank lines.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from ie_core import Generation, InterpModel, SamplingParams, Steering, load_model
from ie_core.errors import UnsupportedOperationError
from ie_core.grammar import Address, check_layer, to_address
from ie_core.runner import loop
from ie_core.sync import unwrap
from inspect_ai.model import (
    ChatMessage,
    GenerateConfig,
    ModelAPI,
    ModelOutput,
    ModelUsage,
)
from inspect_ai.tool import ToolChoice, ToolInfo

from ie_evals.arguments import LOAD_ARGS, EvalArgumentError
from ie_evals.interventions import check_interventions, load_interventions
from ie_evals.sample_captures import CAPTURE_KEY, keep_captures
from ie_evals.scoring import cut_at_stops

T = TypeVar("T")
API_KEY_ENV = "IE_API_KEY"  # ie_remote.backend.API_KEY_ENV (ie-remote is not a dependency)
# Inspect's default max_connections is 10; the backends batch every request in flight themselves.
MAX_CONNECTIONS = 256
DEFAULT_MAX_TOKENS = 256


async def on_ie_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Await `coro` on ie-core's background loop, where the models' engines live (a vLLM engine
    belongs to the loop it started on), from Inspect's own loop."""
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop()))


def messages_text(model: InterpModel, messages: Sequence[ChatMessage]) -> str:
    """The prompt for `messages`: the model's chat template, or their texts joined by blank
    lines where the tokenizer has no template."""
    plain = [{"role": m.role, "content": m.text} for m in messages]
    try:
        return model.apply_chat_template(plain, add_generation_prompt=True)
    except UnsupportedOperationError:
        return "\n\n".join(m["content"] for m in plain)


def sampling_for(config: GenerateConfig) -> SamplingParams:
    """Inspect's generation options as the engine's (greedy unless a temperature is given)."""
    if config.num_choices not in (None, 1):
        raise EvalArgumentError("interp-engine gives one choice per request (num_choices=1)")
    if config.logprobs:
        raise EvalArgumentError(
            "interp-engine's Inspect provider returns no logprobs; use the lm-eval model or "
            "SamplingParams(logprobs=k) in Python"
        )
    return SamplingParams(
        max_new_tokens=config.max_tokens or DEFAULT_MAX_TOKENS,
        temperature=config.temperature or 0.0,
        top_k=config.top_k or 0,
        top_p=config.top_p if config.top_p is not None else 1.0,
        seed=config.seed,
    )


def checked_addresses(model: InterpModel, capture: str | Sequence[str] | None) -> list[Address]:
    """`capture` (a comma-separated string from `-M capture=...`, or a list) as addresses the
    model serves, refused before any forward."""
    if capture is None:
        return []
    names = capture.split(",") if isinstance(capture, str) else list(capture)
    out = []
    for name in names:
        address = to_address(name.strip(), check=True)
        check_layer(address, model.n_layers, "capture")
        model.point_width(address)  # refuses a point this backend does not serve
        out.append(address)
    return out


class InterpEngineAPI(ModelAPI):
    """`interp-engine/MODEL`: in-process (`backend=`), or `ie serve` at `base_url` (remote)."""

    def __init__(
        self,
        model_name: str,
        base_url: str | None = None,
        api_key: str | None = None,
        config: GenerateConfig | None = None,
        backend: str = "auto",
        interventions: str | None = None,
        ie_model: Any = None,
        steering: Sequence[Steering] | None = None,
        capture: str | Sequence[str] | None = None,
        **model_args: Any,
    ) -> None:
        # IE_API_KEY: the key the remote backend reads when none is given (`ie serve --api-key`).
        super().__init__(model_name, base_url, api_key, [API_KEY_ENV], config or GenerateConfig())
        unknown = sorted(set(model_args) - set(LOAD_ARGS))
        if unknown:
            raise EvalArgumentError(
                f"unknown interp-engine model args {unknown}; known: backend, interventions, "
                f"{', '.join(LOAD_ARGS)}"
            )
        if interventions is not None and steering is not None:
            raise EvalArgumentError("give interventions=FILE or steering=specs, not both")
        specs = load_interventions(interventions) if interventions is not None else ()
        self.steering: tuple[Steering, ...] = tuple(steering or specs)
        load_kw = {k: v for k, v in model_args.items() if k != "api_key"}
        if ie_model is not None:  # a loaded model, in Python (get_model's own `model` is the name)
            self.model: InterpModel = unwrap(ie_model)
        elif base_url is not None:
            self.model = load_model(base_url, "remote", api_key=self.api_key, **load_kw)
        else:
            self.model = load_model(model_name, backend, **load_kw)
        check_interventions(self.model, self.steering, interventions or "steering")
        self.capture = checked_addresses(self.model, capture)

    def max_connections(self) -> int:
        return MAX_CONNECTIONS

    async def generate(
        self,
        input: list[ChatMessage],
        tools: list[ToolInfo],
        tool_choice: ToolChoice,
        config: GenerateConfig,
    ) -> ModelOutput:
        if tools:
            raise UnsupportedOperationError(
                "interp-engine's Inspect provider does not call tools; give the task no tools"
            )
        sampling = sampling_for(config)
        ids = self.model.to_tokens(messages_text(self.model, input))
        steering = self.steering or None
        metadata: dict[str, Any] | None = None
        if self.capture:
            both = await on_ie_loop(
                self.model.capture_generation(ids, self.capture, sampling, steering=steering)
            )
            out: Generation = both.generation
            metadata = {CAPTURE_KEY: keep_captures(both.cache, uuid.uuid4().hex)}
        else:
            out = await on_ie_loop(self.model.generate(ids, sampling, steering=steering))
        text = cut_at_stops(out.text, config.stop_seqs or ())
        stopped_short = len(out.token_ids) < sampling.max_new_tokens or text != out.text
        result = ModelOutput.from_content(
            model=self.model_name,
            content=text,
            stop_reason="stop" if stopped_short else "max_tokens",
        )
        result.metadata = metadata
        n_in, n_out = len(ids), len(out.token_ids)
        result.usage = ModelUsage(input_tokens=n_in, output_tokens=n_out, total_tokens=n_in + n_out)
        return result


__all__ = ["InterpEngineAPI", "checked_addresses", "messages_text", "on_ie_loop", "sampling_for"]
