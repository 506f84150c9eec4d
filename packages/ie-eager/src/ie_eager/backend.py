"""The `eager` backend: a Hugging Face model with `attn_implementation="eager"` and hooks on its
real modules. It is the reference the other backends are measured against."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, cast

import torch
from ie_core.admission import check_row_steering
from ie_core.cache import ActivationCache
from ie_core.capabilities import Capabilities
from ie_core.errors import ModelClosedError, PointUnavailableError, UnsupportedOperationError
from ie_core.front import ModelFront
from ie_core.grammar import AddressLike, Family, family_for_architecture
from ie_core.lora import LoraSpec
from ie_core.models import resolve_model_path
from ie_core.plan import CAPTURE, DECODE, GENERATE, Outcome, Plan
from ie_core.prompts import position_limit, tokenizer_ids
from ie_core.protocol import Generation, Prompt, SamplingParams, SteeringArg, StreamChunk
from ie_core.reduce import Context, LensTopK, TokenLogits, reduce_cache
from ie_core.reduce.host import check_reductions
from ie_core.steer_scope import pin_prompt
from ie_core.text_stream import TextStream
from torch import nn

from ie_eager import capability, checkpoint, lens, prefix_cells, weights
from ie_eager.admission import EagerAdmission
from ie_eager.decode import DecodeStep, decode_steps
from ie_eager.devices import DeviceUnavailableError as DeviceUnavailableError
from ie_eager.devices import resolve_device, resolve_dtype
from ie_eager.hooks import Session
from ie_eager.lora import Adapters, applied, applied_per_step
from ie_eager.progress_bar import generation_bar
from ie_eager.resolve import Resolved, Resolver, Tap
from ie_eager.structure import Structure, analyze


def _text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _n_layers(config: Any) -> int:
    text = _text_config(config)
    for name in ("num_hidden_layers", "n_layer", "num_layers"):
        value = getattr(text, name, None)
        if value is not None:
            return int(value)
    raise ValueError(f"{type(config).__name__} has no layer count")


class EagerModel(ModelFront):
    """A loaded HF causal LM speaking `ie_core.protocol.InterpModel`.

    Methods are async (the protocol is), but run their torch work directly: on a CPU one forward
    occupies the caller until it finishes. `capture(..., grad=True)` keeps the autograd graph.
    The request methods come from `ModelFront`; this class executes their plans."""

    backend = "eager"

    def __init__(
        self, hf_model: nn.Module, tokenizer: Any, model_id: str, family: Family | None = None
    ) -> None:
        self._hf_model: nn.Module | None = hf_model.eval()
        self.tokenizer = tokenizer
        self.model_id = model_id
        config = hf_model.config
        self.config = config
        self.text_config = _text_config(config)
        arch = (getattr(config, "architectures", None) or [type(hf_model).__name__])[0]
        self.family = (
            family
            or family_for_architecture(arch)
            or family_for_architecture(type(hf_model).__name__)
        )
        self.structure: Structure = analyze(hf_model, config, self.text_config, _n_layers(config))
        self.resolver = Resolver(self.structure, self.family, hf_model, self._probe)
        self._points: tuple[str, ...] | None = None
        self.adapters = Adapters(hf_model, model_id)
        self.max_positions = position_limit(self.text_config)
        self.admission = EagerAdmission(
            tokenizer,
            self.resolver,
            self.structure.shapes.vocab,
            self.max_positions,
            next(hf_model.parameters()).dtype,
            self._check_open,
            (getattr(hf_model, "generation_config", None), config, tokenizer),
        )

    def weight_parts(self, part: str) -> Any:
        """Raw weights for `model.W_Q`, `model.W_U`, ... (`ie_eager.weights`)."""
        return weights.weight_parts(self, part)

    def tl_source_config(self) -> Any:
        return self.text_config

    @property
    def hf_model(self) -> nn.Module:
        """The wrapped HF model; after `shutdown()` every use raises `ModelClosedError`."""
        self._check_open()
        assert self._hf_model is not None
        return self._hf_model

    def _check_open(self) -> None:
        if self._hf_model is None:
            raise ModelClosedError(
                f"{self.model_id} was shut down and its weights dropped; load it again "
                "with load_model(...)"
            )

    @property
    def closed(self) -> bool:
        return self._hf_model is None

    def _probe(self, tap: Tap, n: int) -> torch.Size:
        """Shape of the raw tensor at `tap` on a forward of `n` tokens (layout detection)."""
        shapes: list[torch.Size] = []

        def grab(value: Any) -> None:
            t = value[tap.item] if isinstance(value, tuple | list) else value
            shapes.append(t.shape)

        if tap.io == "in":
            handle = tap.module.register_forward_pre_hook(
                lambda m, a, k: grab(a[0] if a else k["hidden_states"]), with_kwargs=True
            )
        else:
            handle = tap.module.register_forward_hook(lambda m, a, o: grab(o))
        try:
            ids = torch.zeros((1, n), dtype=torch.long, device=self.device)
            with torch.no_grad():
                self.hf_model(input_ids=ids, use_cache=False)
        finally:
            handle.remove()
        return shapes[0]

    # -- facts --

    @property
    def n_layers(self) -> int:
        return len(self.structure.blocks)

    @property
    def d_model(self) -> int:
        return self.structure.shapes.d_model

    @property
    def device(self) -> torch.device:
        return next(self.hf_model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.hf_model.parameters()).dtype

    def __repr__(self) -> str:
        fam = self.family.slug if self.family else "unregistered family"
        return f"EagerModel({self.model_id!r}, {fam}, {self.n_layers} layers, {self.device}, {self.dtype})"

    def points(self) -> tuple[str, ...]:
        if self._points is None:
            self._points = self.resolver.point_names()
        return self._points

    def capabilities(self) -> Capabilities:
        """What this model serves, per point, from its own resolver (see ie_core.capabilities)."""
        return capability.capabilities(self.resolver)

    def resolve(self, address: AddressLike) -> Resolved:
        return self.resolver.resolve(address)

    def point_width(self, address: AddressLike) -> int:
        r = self.resolver.resolve(address)
        if r.width is None:
            raise PointUnavailableError(
                f"{r.address} has no fixed width (attention maps are heads x q x k; path points "
                "take the module's output)"
            )
        return r.width

    # -- tokens --

    def to_tokens(self, text: str, *, prepend_bos: bool | None = None) -> list[int]:
        """Token ids: the tokenizer's own special tokens (None), its BOS first (True) or no
        special tokens (False); see `ie_core.prompts.text_ids`."""
        self._check_open()
        return tokenizer_ids(self.tokenizer, text, prepend_bos)

    def to_string(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True
    ) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            raise UnsupportedOperationError(
                f"{self.model_id}'s tokenizer has no chat template; build the prompt text yourself"
            )
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )

    # -- forward --

    def forward_with_cache(
        self,
        tokens: Any,
        addresses: Sequence[AddressLike] = (),
        *,
        steering: SteeringArg = None,
        grad: bool = False,
        row_steering: Sequence[SteeringArg] = (),
        lora: LoraSpec | None = None,
        row_lora: Sequence[LoraSpec | None] = (),
    ) -> tuple[torch.Tensor, ActivationCache]:
        """One forward: (logits `[batch, seq, vocab]`, cache). Eager-only convenience.

        `row_steering[b]` steers prompt b alone (after `steering`, which steers every prompt);
        `lora` runs every prompt under a LoRA adapter (`ie_core.lora`), `row_lora[b]` prompt b
        (None: the base model); the model is left as it was."""
        rows = self.admission.batch_ids(tokens)
        reads = [self.resolver.resolve(a) for a in addresses]
        writes = self.admission.writes(steering, rows)
        writes += self.admission.row_writes(row_steering, rows)
        if row_lora and len(row_lora) != len(rows):
            raise ValueError(f"{len(rows)} prompts but {len(row_lora)} LoRA entries; give one each")
        adapters = self.adapters.rows(list(row_lora) if row_lora else [lora] * len(rows))
        ids = torch.tensor(rows, dtype=torch.long, device=self.device)
        context = torch.enable_grad() if grad else torch.no_grad()
        with (
            context,
            applied(self.hf_model, adapters),
            Session(self.hf_model, reads, writes, keep_graph=grad) as session,
        ):
            session.batch_shape = (ids.shape[0], ids.shape[1])
            logits = self.hf_model(input_ids=ids, use_cache=False).logits
        missing = [r.address for r in reads if r.address not in session.captured]
        if missing:
            raise PointUnavailableError(
                f"{', '.join(map(str, missing))} did not fire during the forward; the module was not run"
            )
        cache = ActivationCache({r.address: session.captured[r.address] for r in reads})
        return (logits if grad else logits.detach()), cache

    # -- plans (the protocol's requests are ie_core.front.ModelFront's) --

    async def execute(self, plan: Plan) -> Outcome:
        if plan.kind == CAPTURE:
            return self._capture(plan)
        if plan.kind == DECODE:
            return self._lens(plan)
        assert plan.sampling is not None
        plan.refuse_streamed_reductions()
        adapter = self.adapters.rows([plan.lora])
        with applied(self.hf_model, adapter):
            generation = self._generate(plan.prompt, plan.sampling, plan.steering)
        if plan.kind == GENERATE:
            return Outcome(generation)
        full = list(generation.prompt_ids) + list(generation.token_ids[:-1])
        pinned = pin_prompt(plan.steering, len(generation.prompt_ids), len(full))
        cache = self.forward_with_cache([full], plan.captures, steering=pinned, lora=plan.lora)[1]
        return Outcome(generation, cache)

    async def execute_stream(self, plan: Plan) -> AsyncIterator[StreamChunk]:
        """Each token as it is sampled, with the plan's reductions of the rows its forward
        computed, reduced here (the rows live in this process)."""
        self._check_open()
        assert plan.sampling is not None
        ids = self.admission.prompt_ids(plan.prompt)
        check_reductions(plan.reductions, self.point_width, self.admission.vocab)
        reads = {r.label: self.resolver.resolve(r.address) for r in plan.reductions}
        context = Context(lens=lambda rows: lens.decode(self, rows))
        text = TextStream(lambda out: self.tokenizer.decode(out, skip_special_tokens=True))
        steps = decode_steps(
            self.hf_model, self.admission, ids, plan.sampling, plan.steering, list(reads.values())
        )
        adapter = self.adapters.rows([plan.lora])
        for step in applied_per_step(self.hf_model, adapter, steps):
            reduced = {
                r.label: r.reducer.apply(step.rows[reads[r.label].address][0], context)
                for r in plan.reductions
            }
            yield StreamChunk(step.token, text.push(step.token), step.logprobs, reduced)

    def attention_layers(self) -> Sequence[int]:
        return range(self.n_layers)

    def _capture(self, plan: Plan) -> Outcome:
        """One forward reading the plan's addresses and its reductions' rows, reduced here (the
        rows live in this process); a sweep's final logits from the first position each cell
        changes (`ie_eager.prefix_cells`)."""
        if self._final_logits_only(plan) and not plan.adapters():
            prompts = list(plan.prompt)
            check_row_steering(plan.row_steering, len(prompts))
            steerings = [plan.steering_of(i) for i in range(len(prompts))]
            (r,) = plan.reductions
            ids = cast(TokenLogits, r.reducer).ids
            selected, lse = prefix_cells.final_token_logits(
                self.hf_model, self.admission, prompts, steerings, ids
            )
            return Outcome(reduced={r.label: {"selected": selected, "lse": lse}})
        check_reductions(plan.reductions, self.point_width, self.admission.vocab)
        reads = list(dict.fromkeys([*plan.captures, *(r.address for r in plan.reductions)]))
        cache = self.forward_with_cache(
            plan.prompt,
            reads,
            steering=plan.steering,
            grad=plan.grad,
            row_steering=plan.row_steering,
            lora=plan.lora,
            row_lora=plan.row_lora,
        )[1]
        if not plan.reductions:
            return Outcome(cache=cache)
        context = Context(lens=lambda rows: lens.decode(self, rows))
        reduced = reduce_cache(cache, plan.reductions, context)
        return Outcome(cache=ActivationCache({a: cache[a] for a in plan.captures}), reduced=reduced)

    def _final_logits_only(self, plan: Plan) -> bool:
        last = f"resid_post.{self.n_layers - 1}"
        return (
            not plan.captures
            and len(plan.reductions) == 1
            and plan.reductions[0].last
            and plan.reductions[0].address == last
            and isinstance(plan.reductions[0].reducer, TokenLogits)
        )

    def _decode(
        self, ids: list[int], params: SamplingParams, steering: SteeringArg
    ) -> Iterator[DecodeStep]:
        return decode_steps(self.hf_model, self.admission, ids, params, steering)

    def _generate(
        self, tokens: Prompt, sampling: SamplingParams, steering: SteeringArg
    ) -> Generation:
        ids = self.admission.prompt_ids(tokens)
        steps = list(generation_bar(self._decode(ids, sampling, steering), sampling.max_new_tokens))
        out = [s.token for s in steps]
        logprobs = tuple(s.logprobs for s in steps if s.logprobs is not None)
        return Generation(
            tuple(ids),
            tuple(out),
            self.tokenizer.decode(out, skip_special_tokens=True),
            logprobs or None,
        )

    # -- lens --

    def _lens(self, plan: Plan) -> Outcome:
        """The logit lens on the plan's rows (`grad=True` keeps autograd on: gradients flow to
        the rows and the weights), or its `LensTopK` reduction's read-out."""
        self._check_open()
        if not plan.reductions:
            return Outcome(
                reduced={DECODE: {"logits": lens.decode(self, plan.prompt, grad=plan.grad)}}
            )
        (r,) = plan.reductions
        top = lens.topk(self, plan.prompt, cast(LensTopK, r.reducer).k)
        return Outcome(reduced={r.label: {"ids": top.ids, "probs": top.probs}})

    # -- lifecycle --

    async def warmup(self) -> None:
        model = self.hf_model
        ids = self.to_tokens("Hello")
        with torch.no_grad():
            model(input_ids=torch.tensor([ids], device=self.device), use_cache=False)

    async def shutdown(self) -> None:
        """Drop the weights; any later use raises `ModelClosedError`. Idempotent."""
        self._hf_model = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _load_tokenizer(folder: Any, **hub: Any) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, **hub)


def load(
    model_id: Any,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    tokenizer: Any = None,
    **kw: Any,
) -> EagerModel:
    """Load an HF folder / id / `ie-synthetic/<family>`, or wrap an HF model object (pass
    `tokenizer=`), with eager attention on an explicit device and dtype (float32 on CPU).

    Anything but a decoder-only causal LM is refused (`UnsupportedModelError`)."""
    from transformers import PreTrainedModel

    dev = resolve_device(device)
    if isinstance(model_id, PreTrainedModel):
        if tokenizer is None:
            raise ValueError("pass tokenizer= together with an HF model object")
        model = model_id
        name = str(
            kw.pop("name", None)
            or getattr(model.config, "_name_or_path", "")
            or type(model).__name__
        )
        checkpoint.check_config(name, model.config)
        if getattr(model.config, "_attn_implementation", "eager") != "eager":
            model.set_attn_implementation("eager")
        # transformers' decorated `to` confuses the type checker about `self`, not the call.
        if dtype is not None:
            model = cast(Any, model).to(resolve_dtype(dtype, dev, model.config))
        model = cast(Any, model).to(dev)
        checkpoint.check_causal(name, model)
        return EagerModel(model, tokenizer, name)
    model_name = os.fspath(model_id)
    folder = resolve_model_path(model_name)
    source: Any = folder if folder is not None else model_name
    hub = _hub_options(kw) if folder is None else {}
    config = checkpoint.read_config(model_name, source, hub)
    torch_dtype = resolve_dtype(dtype, dev, config)
    model = checkpoint.load_weights(
        model_name, source, hub, attn_implementation="eager", dtype=torch_dtype, **kw
    ).to(dev)
    checkpoint.check_causal(model_name, model)
    tok = tokenizer if tokenizer is not None else _load_tokenizer(source, **hub)
    return EagerModel(model, tok, model_name)


HUB_OPTIONS = ("revision", "token", "local_files_only", "cache_dir")


def _hub_options(kw: dict[str, Any]) -> dict[str, Any]:
    """Pop the Hub download options (`revision`, `token`, ...) for config, weights and tokenizer.

    A Hub id downloads into the Hugging Face cache unless `local_files_only=True` or
    `HF_HUB_OFFLINE=1`, which huggingface_hub honours itself.
    """
    return {name: kw.pop(name) for name in HUB_OPTIONS if name in kw}
