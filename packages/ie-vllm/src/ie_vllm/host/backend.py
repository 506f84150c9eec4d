"""`VLLMModel`: the InterpModel protocol over vLLM's AsyncLLM, and the two backend loaders.

`vllm` runs eagerly with the worker extension's hooks (every servable point, chosen per request);
`vllm-generate` runs vLLM at its own defaults and serves no point. What a backend serves is its
`Variant` (`ie_vllm.host.variant`), chosen once here; the methods ask it, never the name.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import torch
from ie_core.admission import check_row_steering
from ie_core.cache import ActivationCache
from ie_core.capabilities import PointCapability
from ie_core.errors import BadPromptError, GradientUnavailableError
from ie_core.front import ModelFront
from ie_core.grammar import POINTS, AddressLike, to_address
from ie_core.model_info import DescribedModel, ModelInfo
from ie_core.models import resolve_model_path
from ie_core.plan import CAPTURE, CAPTURE_GENERATION, DECODE, GENERATE, Outcome, Plan
from ie_core.prompts import tokenizer_ids
from ie_core.protocol import Generation, Prompt, SamplingParams, SteeringArg, StreamChunk
from ie_core.reduce import LensTopK, per_prompt
from ie_core.runner import run

from ie_vllm.host import capability, features, lens_decode, quiet_logs, streamed, weights
from ie_vllm.host import logprobs as lp
from ie_vllm.host.admission import Admission
from ie_vllm.host.channel import Channel, HookedChannel
from ie_vllm.host.cpu_support import check_cpu_support
from ie_vllm.host.engine import Engine
from ie_vllm.host.lora import HostAdapters
from ie_vllm.host.parallel_support import check_data_parallel, check_pipeline_parallel
from ie_vllm.host.policy import SitePolicy
from ie_vllm.host.request import Flow, gather
from ie_vllm.host.variant import GENERATE as GENERATE_BACKEND
from ie_vllm.host.variant import HOOKED, Variant, variant_for
from ie_vllm.pipeline import merge_infos, merge_stats
from ie_vllm.row_budget import smallest_limit

_log = logging.getLogger(__name__)

DEFAULT_SAMPLING = SamplingParams()


class VLLMModel(ModelFront, DescribedModel):
    """One vLLM engine behind the InterpModel protocol. Build with `load_hooked` / `load_generate`.

    `channel` carries requests to the workers and `policy` narrows what is served (see
    `ie_vllm.host.channel` and `ie_vllm.host.policy`); the defaults are the hooked worker extension's.
    """

    def __init__(
        self,
        engine: Engine,
        info: ModelInfo | Mapping[str, Any],
        tokenizer: Any,
        model_id: str,
        backend: str,
        *,
        channel: Channel | None = None,
        policy: SitePolicy | None = None,
        row_limit: int | None = None,
    ) -> None:
        self.engine = engine
        self.info = info if isinstance(info, ModelInfo) else ModelInfo.from_wire(info)
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.backend = backend
        self.variant: Variant = variant_for(backend)
        self.channel: Channel = channel if channel is not None else HookedChannel(engine)
        self.policy = policy if policy is not None else SitePolicy(self.info.writable)
        self.admission = Admission(
            self.variant, self.info, tokenizer, self.policy, engine, row_limit=row_limit
        )
        self.flow = Flow(engine, self.channel, self._params, self._text, lambda: self.loras.base())
        # Which adapters this engine serves is known at `create`; a bare model refuses them.
        self.loras = HostAdapters(None, model_id, backend, {})
        # The worker knows no name: the same fields `GET /v1/ie/info` fills for a remote model.
        self.info = self.info.with_fields(
            model_id=model_id,
            backend=backend,
            points=self.points(),
            bos_token_id=getattr(tokenizer, "bos_token_id", None),
        )

    # --- construction --------------------------------------------------------------------------

    @classmethod
    async def create(cls, model_id: str, backend: str = HOOKED, **kw: Any) -> VLLMModel:
        quiet_logs.configure()  # before the checks below first import vLLM
        path = resolve_model_path(model_id)
        source = str(path) if path is not None else model_id
        hooked = variant_for(backend).hooked
        check_pipeline_parallel(kw, backend)
        check_data_parallel(kw, backend)
        check_cpu_support(path, str(kw.get("dtype", "float32")))  # before minutes of engine start
        engine = await Engine.start(source, hooked=hooked, **kw)
        try:
            info = merge_infos(await engine.rpc("ie_setup", hooked))  # one answer per stage
            row_limit = smallest_limit(await engine.rpc("ie_row_limit"))
        except BaseException:
            engine.shutdown()
            raise
        _log.info("%s: %s on vLLM's %s", model_id, backend, info.model_runner)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(source)
        model = cls(engine, info, tokenizer, model_id, backend, row_limit=row_limit)
        model.loras = HostAdapters(source, model_id, backend, kw)
        return model

    # --- shape -------------------------------------------------------------------------------

    def weight_parts(self, part: str) -> Any:
        """Raw weights for `model.W_Q`, `model.W_U`, ... read in the workers (`host.weights`)."""
        return weights.weight_parts(self, part)

    def tl_source_config(self) -> Any:
        return self.engine.llm.model_config.hf_text_config

    def points(self) -> tuple[str, ...]:
        """Names of the points this model serves on this backend, in forward order."""
        if not self.variant.serves_points:
            return ()
        served = {to_address(a).name for a in self.info.widths}
        return tuple(p.name for p in POINTS if p.name in served)

    def point_width(self, address: AddressLike) -> int:
        return self.info.widths[self.admission.check(address)]

    def capabilities(self) -> dict[str, PointCapability]:
        """What this engine serves, per point, from its own address check."""
        return capability.capabilities(self)

    # --- tokens ------------------------------------------------------------------------------

    def to_tokens(self, text: str, *, prepend_bos: bool | None = None) -> list[int]:
        """Token ids: the tokenizer's own special tokens (None), its BOS first (True) or no
        special tokens (False); see `ie_core.prompts.text_ids`."""
        return tokenizer_ids(self.tokenizer, text, prepend_bos)

    def to_string(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids)))

    def _text(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True
    ) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
            )
        )

    # --- sampling ----------------------------------------------------------------------------

    def _params(self, key: str, sampling: SamplingParams) -> Any:
        return self.engine.sampling_params(
            key,
            max_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            seed=sampling.seed,
            ignore_eos=not sampling.stop_at_eos,
            logprobs=sampling.logprobs,
        )

    # --- protocol ------------------------------------------------------------------------------

    async def execute(self, plan: Plan) -> Outcome:
        """Capture: one forward per prompt, all submitted together; the GENERATE kinds: one
        request, read over prompt + generated[:-1] as vLLM runs it (prefill, then decode)."""
        if plan.kind == CAPTURE:
            return await self._capture(plan)
        if plan.kind == DECODE:
            return await self._lens(plan)
        assert plan.sampling is not None
        plan.refuse_streamed_reductions()
        if plan.kind == CAPTURE_GENERATION:
            self.admission.require_points("capture_generation")
        elif plan.steering:
            self.admission.require_points("steering")
        req = self.admission.request(
            plan.prompt, plan.sampling.max_new_tokens, plan.captures, plan.steering
        )
        lora = self.loras.request(plan.lora)
        last: list[Any] = []
        token_ids, rows = await self.flow.on_engine(
            self.flow.run(req.ids, plan.sampling, req.captures, req.steer, last, lora=lora)
        )
        generation = self._generation(req.ids, token_ids, plan.sampling, last)
        if plan.kind == GENERATE:
            return Outcome(generation)
        return Outcome(generation, ActivationCache({a: rows[a].unsqueeze(0) for a in req.captures}))

    async def execute_stream(self, plan: Plan) -> AsyncIterator[StreamChunk]:
        """Each token as vLLM samples it; a plan's reductions run where the rows are
        (`ie_vllm.host.streamed`), each step's outputs in its chunk."""
        assert plan.sampling is not None
        if plan.reductions:
            stream = streamed.reduced_stream(self, plan)
            try:
                async for chunk in stream:
                    yield chunk
            finally:
                await cast(Any, stream).aclose()
            return
        if plan.steering:
            self.admission.require_points("steering")
        req = self.admission.request(plan.prompt, plan.sampling.max_new_tokens, (), plan.steering)
        lora = self.loras.request(plan.lora)
        async for item in self.flow.bridge(
            self.flow.stream_tokens(req.ids, plan.sampling, req.steer, lora)
        ):
            yield item

    def attention_layers(self) -> Sequence[int]:
        self.admission.require_points("capture_attention")
        parsed = [to_address(a) for a in self.info.widths]
        return [a.layer for a in parsed if a.name == "attn_probs" and a.layer is not None]

    async def _capture(self, plan: Plan) -> Outcome:
        """One forward per prompt, all in flight together; each reduction runs in the worker
        (`ie_vllm.worker.reducers`), so only its result crosses."""
        self.admission.require_points("capture")
        self._refuse_grad(plan.grad, "capture")
        prompts = self.admission.prompts(plan.prompt)
        if plan.captures or not all(r.last for r in plan.reductions):
            _refuse_ragged([len(p) for p in prompts])
        captures = self.admission.captures(plan.captures)
        reductions = features.admitted(self, plan.reductions)
        one = SamplingParams(max_new_tokens=1, stop_at_eos=False)

        check_row_steering(plan.row_steering, len(prompts))
        for ids in prompts:
            self.admission.check_length(ids, 1)  # capture samples one token
            self.admission.check_rows(ids, 0, captures)  # its rows: the prompt's
        steers = [self.admission.steer_specs(plan.steering_of(b), p) for b, p in enumerate(prompts)]
        if plan.row_lora and len(plan.row_lora) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(plan.row_lora)} LoRA entries")
        loras = [self.loras.request(plan.lora_of(b)) for b in range(len(prompts))]

        async def one_prompt(ids: tuple[int, ...], steer: Any, lora: Any) -> dict[str, Any]:
            specs = features.reducer_specs(reductions, len(ids))
            _, rows = await self.flow.run(ids, one, captures, steer, reducers=specs, lora=lora)
            return rows

        async def every_prompt() -> list[dict[str, torch.Tensor]]:
            await features.send_dictionaries(self, reductions)
            jobs = zip(prompts, steers, loras, strict=True)
            return await gather(*(one_prompt(p, s, lo) for p, s, lo in jobs))

        results = await self.flow.on_engine(every_prompt())
        reduced = per_prompt(reductions, results)
        if reductions and not captures:
            return Outcome(cache=ActivationCache({}), reduced=reduced)
        cache = self._batch_cache(captures, results, [len(p) for p in prompts])
        return Outcome(cache=cache, reduced=reduced)

    def _refuse_grad(self, grad: object, what: str) -> None:
        if grad:
            raise GradientUnavailableError(
                f"{what}(grad=True) is not available on backend {self.backend!r}: vLLM runs the "
                "forward under inference mode in its worker processes, so no autograd graph "
                "exists to return; load the model with backend='eager' for gradients"
            )

    def _batch_cache(
        self,
        captures: tuple[str, ...],
        results: Sequence[dict[str, torch.Tensor]],
        lengths: list[int],
    ) -> ActivationCache:
        if len(set(lengths)) > 1:
            raise ValueError(
                f"prompts of different lengths {lengths} cannot share one [batch, seq] tensor; "
                "capture them one at a time or pad them to one length"
            )
        out: dict[str, torch.Tensor] = {}
        for address in captures:
            parts = []
            for rows in results:
                if address not in rows:
                    raise RuntimeError(f"the worker returned no rows for {address}")
                parts.append(rows[address])
            out[address] = torch.stack(parts)
        return ActivationCache(out)

    async def capture_generation_stream(
        self,
        tokens: Prompt,
        addresses: Sequence[AddressLike],
        sampling: SamplingParams = DEFAULT_SAMPLING,
        *,
        steering: SteeringArg = None,
    ) -> AsyncIterator[tuple[StreamChunk, ActivationCache]]:
        """Yield each generated token with the rows computed since the previous one (`[1, new, ...]`).

        The first token comes with the prompt's rows; token i with the row of token i-1.
        """
        self.admission.require_points("capture_generation_stream")
        req = self.admission.request(tokens, sampling.max_new_tokens, addresses, steering)
        async for item in self.flow.bridge(
            self.flow.stream_capture(req.ids, sampling, req.captures, req.steer)
        ):
            yield item

    def _generation(
        self,
        prompt_ids: tuple[int, ...],
        token_ids: tuple[int, ...],
        sampling: SamplingParams = DEFAULT_SAMPLING,
        last: Sequence[Any] = (),
    ) -> Generation:
        steps = None
        if sampling.logprobs is not None and last:
            steps = lp.steps(last[0], sampling.logprobs)
        return Generation(prompt_ids, token_ids, self._text(token_ids), steps)

    # --- lens ----------------------------------------------------------------------------------

    async def _lens(self, plan: Plan) -> Outcome:
        """The lens on the plan's rows in the worker: full logits `[..., vocab]` (final norm,
        unembed, scale, softcap) for small inputs, or its `LensTopK`'s `[..., k]`."""
        rows = plan.prompt
        self._refuse_grad(plan.grad or getattr(rows, "requires_grad", False), "decode_residuals")
        if not plan.reductions:
            return Outcome(reduced={DECODE: {"logits": await lens_decode.logits(self, rows)}})
        (r,) = plan.reductions
        top = await lens_decode.topk(self, rows, cast(LensTopK, r.reducer).k)
        return Outcome(reduced={r.label: {"ids": top.ids, "probs": top.probs}})

    async def warmup(self) -> None:
        await self.generate([self.tokenizer.bos_token_id or 0], SamplingParams(max_new_tokens=2))

    def stop_reason(self) -> Exception | None:
        """Why this model's engine can run nothing more (shut down, or its core died), else
        None: a server asks before calling a disconnected request the client's doing."""
        return self.engine.stop_reason()

    async def shutdown(self) -> None:
        """Fail requests in flight with `EngineShutdownError`, then stop the engine's processes."""
        close = self.engine.close()
        if asyncio.get_running_loop() is self.engine.loop:
            alive = await close
        else:
            alive = await asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(close, self.engine.loop)
            )
        if alive:
            raise RuntimeError(f"engine processes {alive} did not exit after shutdown")

    async def stats(self) -> dict[str, Any]:
        """Worker registry and hook counts (tests check that everything was released); under
        data parallelism, also each replica's own (`replicas`, in rank order)."""
        per_replica = await self.flow.on_engine(self.engine.replica_rpc("ie_stats"))
        merged = merge_stats([rank for replica in per_replica for rank in replica])
        if len(per_replica) > 1:
            merged["replicas"] = [merge_stats(replica) for replica in per_replica]
        return merged


def _refuse_ragged(lengths: list[int]) -> None:
    """Prompts of different lengths cannot share one `[batch, seq]` tensor: refuse before any
    forward runs (ie_core.experiments.ragged.capture_ragged pads them and records the lengths)."""
    if len(set(lengths)) > 1:
        raise BadPromptError(
            f"prompts of different lengths {lengths} cannot share one [batch, seq] tensor; use "
            "ie_core.experiments.ragged.capture_ragged (right-padded, true lengths recorded) or capture "
            "them one at a time"
        )


def _load(model_id: str, backend: str, **kw: Any) -> VLLMModel:
    """Build on ie-core's background loop, so the sync mirror and any async caller share it."""
    if isinstance(model_id, Path):
        model_id = str(model_id)
    return run(VLLMModel.create(model_id, backend, **kw))


def load_hooked(model_id: str, **kw: Any) -> VLLMModel:
    """Entry point `vllm`: hooks, enforce_eager, every servable point chosen per request."""
    return _load(model_id, HOOKED, **kw)


def load_generate(model_id: str, **kw: Any) -> VLLMModel:
    """Entry point `vllm-generate`: vLLM at its own defaults; capture and steering refused."""
    return _load(model_id, GENERATE_BACKEND, **kw)


async def create(model_id: str, backend: str = HOOKED, **kw: Any) -> VLLMModel:
    """Async construction on the caller's loop (the engine then belongs to that loop)."""
    return await VLLMModel.create(model_id, backend, **kw)


__all__ = ["VLLMModel", "create", "load_generate", "load_hooked"]
