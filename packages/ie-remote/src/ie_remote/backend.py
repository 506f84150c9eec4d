"""`RemoteModel`: the `InterpModel` protocol over HTTP, against a server started by `ie serve`.

Every call is one HTTP request to the server's `/v1/ie/*` routes (or vLLM's own `/tokenize`),
so the server's host code validates prompts, addresses and specs exactly as in-process; an error
the server names comes back as the same `ie_core.errors` class. Tensors travel as safetensors.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import httpx
import ie_core.errors as ie_errors
from ie_core.cache import ActivationCache
from ie_core.errors import (
    GradientUnavailableError,
    InterpError,
    PointUnavailableError,
    UnsupportedOperationError,
)
from ie_core.front import ModelFront
from ie_core.grammar import AddressLike, to_address
from ie_core.model_info import DescribedModel, ModelInfo
from ie_core.ops import SteeringOp, op_from_dict
from ie_core.plan import CAPTURE, DECODE, GENERATE, Outcome, Plan
from ie_core.prompts import text_ids
from ie_core.protocol import (
    Generation,
    SamplingParams,
    StreamChunk,
)
from ie_core.reduce import Context, LensTopK, nested, reduce_cache
from ie_core.reduce.host import check_reductions
from ie_core.wire import (
    ROUTES,
    SAFETENSORS,
    decode_tensors,
    encode_tensors,
)

BACKEND = "remote"
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_SAMPLING = SamplingParams()
API_KEY_ENV = "IE_API_KEY"  # the server's --api-key, when `api_key=` is not passed


class RemoteError(InterpError, RuntimeError):
    """The server failed in a way no ie-core error names (its message is kept)."""


@dataclass(frozen=True)
class Server:
    url: str
    headers: dict[str, str]
    timeout: float

    def client(self) -> httpx.AsyncClient:
        # One client per call: a client binds its connections to the loop it first ran on.
        return httpx.AsyncClient(base_url=self.url, headers=self.headers, timeout=self.timeout)

    def sync_client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=self.timeout)


def _raise_for(response: httpx.Response) -> None:
    """Re-raise a server error as the ie-core class it names, with the server's sentence."""
    if response.status_code < 400:
        return
    try:
        err = response.json()["error"]
        message, kind = str(err["message"]), str(err.get("type", ""))
    except (ValueError, KeyError, TypeError):
        message, kind = response.text[:500], ""
    cls = getattr(ie_errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            error = cls(message)
        except TypeError:  # a class whose constructor wants more than the sentence
            error = RemoteError(f"{kind}: {message}")
        raise error
    if kind in {"ValueError", "TypeError", "KeyError"}:
        raise ValueError(message)
    raise RemoteError(f"HTTP {response.status_code} from {response.url}: {message}")


class RemoteModel(ModelFront, DescribedModel):
    """A model served by `ie serve`; build with `load_model(url, backend="remote")`."""

    backend = BACKEND
    serves_named_dictionaries = True  # the server resolves `ie serve --sae NAME=SOURCE` names

    def __init__(self, server: Server, info: ModelInfo) -> None:
        self.server = server
        self.info = info
        self.model_id = info.model_id

    @classmethod
    def connect(
        cls, url: str, *, api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT_S
    ) -> RemoteModel:
        # As the openai client reads OPENAI_API_KEY: the key may live in the environment.
        api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV) or None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        server = Server(url.rstrip("/"), headers, timeout)
        with server.sync_client() as client:
            response = client.get(ROUTES["info"].url)
        _raise_for(response)
        return cls(server, ModelInfo.from_wire(response.json()))

    # --- shape and tokens ------------------------------------------------------------------

    def points(self) -> tuple[str, ...]:
        return self.info.points

    def point_width(self, address: AddressLike) -> int:
        text = str(to_address(address, check=True))
        if text in self.info.widths:
            return self.info.widths[text]
        reason = self.info.refusal(text) or "not served"
        raise PointUnavailableError(f"{text} is unavailable on the server: {reason}", reason)

    def _post_sync(self, path: str, body: dict[str, Any]) -> Any:
        with self.server.sync_client() as client:
            response = client.post(path, json={"model": self.model_id, **body})
        _raise_for(response)
        return response.json()

    def to_tokens(self, text: str, *, prepend_bos: bool | None = None) -> list[int]:
        """Token ids from the server's tokenizer: its own special tokens (None), its BOS first
        (True; the server states it in `info.bos_token_id`) or none (False)."""
        if not isinstance(text, str):
            raise TypeError(f"to_tokens takes a string, got {type(text).__name__}")

        def encode(t: str, special: bool) -> list[int]:
            out = self._post_sync("/tokenize", {"prompt": t, "add_special_tokens": special})
            return list(out["tokens"])

        return text_ids(text, prepend_bos, encode, self.info.bos_token_id)

    def to_string(self, ids: Sequence[int]) -> str:
        return str(self._post_sync("/detokenize", {"tokens": [int(t) for t in ids]})["prompt"])

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True
    ) -> str:
        out = self._post_sync(
            "/tokenize",
            {
                "messages": list(messages),
                "add_generation_prompt": add_generation_prompt,
                "add_special_tokens": False,
            },
        )
        return self.to_string(out["tokens"])

    # --- requests --------------------------------------------------------------------------

    async def _post(self, path: str, body: dict[str, Any] | bytes) -> httpx.Response:
        async with self.server.client() as client:
            if isinstance(body, bytes):
                headers = {"content-type": SAFETENSORS}
                response = await client.post(path, content=body, headers=headers)
            else:
                response = await client.post(path, json=body)
        _raise_for(response)
        return response

    async def execute(self, plan: Plan) -> Outcome:
        """One POST of the plan's JSON to its route; tensors come back as safetensors."""
        if plan.grad:
            raise GradientUnavailableError(
                "backend 'remote' returns tensors over HTTP, which carry no autograd graph; "
                "load the model with backend='eager' and capture(..., grad=True)"
            )
        if plan.kind == DECODE:
            return await self._lens(plan)
        _refuse_logprobs(plan.sampling)
        # A reduction the wire cannot carry (a dictionary loaded here) reads captured rows and
        # is reduced here; the rest run in the server's workers.
        local = tuple(r for r in plan.reductions if not r.reducer.portable())
        check_reductions(local, self.point_width, self.info.vocab_size)
        sent = replace(
            plan,
            captures=(*plan.captures, *(r.address for r in local)),
            reductions=tuple(r for r in plan.reductions if r.reducer.portable()),
        )
        response = await self._post(ROUTES[plan.kind].url, sent.to_wire())
        if plan.kind == GENERATE:
            data = response.json()
            return Outcome(_generation(data))
        tensors, meta = decode_tensors(response.content)
        rows = {a: t for a, t in tensors.items() if "|" not in a}
        if plan.kind != CAPTURE:
            return Outcome(_generation(meta), ActivationCache(rows))
        reduced = nested(tensors, sent.reductions)
        if not local:
            return Outcome(cache=ActivationCache(rows), reduced=reduced)
        reduced.update(reduce_cache(ActivationCache(rows), local, Context()))
        kept = {str(to_address(a)) for a in plan.captures}
        cache = ActivationCache({a: t for a, t in rows.items() if a in kept})
        return Outcome(cache=cache, reduced=reduced)

    async def execute_stream(self, plan: Plan) -> AsyncIterator[StreamChunk]:
        _refuse_logprobs(plan.sampling)
        if plan.reductions:
            raise UnsupportedOperationError(
                f"{type(self).__name__} streams tokens only: generate_stream's lines carry no "
                "reductions (a lens's transport or a loaded dictionary does not cross HTTP); "
                "read the stream on the server's backend ('eager' or 'vllm'), or "
                "capture_generation then decode_residuals / dictionary_features"
            )
        async with (
            self.server.client() as client,
            client.stream("POST", ROUTES["generate_stream"].url, json=plan.to_wire()) as response,
        ):
            if response.status_code >= 400:
                await response.aread()
                _raise_for(response)
            async for line in response.aiter_lines():
                if not line:
                    continue
                item = json.loads(line)
                if "error" in item:
                    raise RemoteError(f"the server's stream failed: {item['error']['message']}")
                yield StreamChunk(int(item["token_id"]), str(item["text"]))

    def attention_layers(self) -> Sequence[int]:
        parsed = [to_address(a) for a in self.info.widths]
        return sorted(a.layer for a in parsed if a.name == "attn_probs" and a.layer is not None)

    async def _lens(self, plan: Plan) -> Outcome:
        """A decode plan's rows, posted as tensors: full logits (`decode_residuals`), or its
        `LensTopK`'s top-k (`lens_topk`, k in the query)."""
        rows = encode_tensors({"rows": plan.prompt})
        if not plan.reductions:
            response = await self._post(ROUTES[DECODE].url, rows)
            return Outcome(reduced={DECODE: decode_tensors(response.content)[0]})
        (r,) = plan.reductions
        k = cast(LensTopK, r.reducer).k
        response = await self._post(f"{ROUTES['lens_topk'].url}?k={k}", rows)
        return Outcome(reduced={r.label: decode_tensors(response.content)[0]})

    async def stats(self) -> dict[str, Any]:
        """The server workers' registry (live requests, installed hooks): empty when idle."""
        async with self.server.client() as client:
            response = await client.get(ROUTES["stats"].url)
        _raise_for(response)
        return dict(response.json())

    # --- dictionaries served by `ie serve --sae NAME=SOURCE` ----------------------------------

    async def served_saes(self) -> dict[str, Any]:
        """Per served name: address, out_address, d_in, d_sae, activation, k, key."""
        async with self.server.client() as client:
            response = await client.get(ROUTES["saes"].url)
        _raise_for(response)
        return dict(response.json())

    def feature_op(
        self, sae: str, feature: int, *, coeff: float | None = None, value: float | None = None
    ) -> SteeringOp:
        """A served feature as a plain op: `coeff` -> `feature_steer`, `value` ->
        `feature_clamp`, neither -> `feature_ablate` (the server builds it from its dictionary)."""
        if coeff is not None and value is not None:
            raise ValueError("give coeff (steer) or value (clamp), not both")
        body: dict[str, Any] = {"sae": sae, "feature": feature}
        if coeff is not None:
            body.update(kind="feature_steer", coeff=coeff)
        elif value is not None:
            body.update(kind="feature_clamp", value=value)
        else:
            body["kind"] = "feature_ablate"
        with self.server.sync_client() as client:
            response = client.post(ROUTES["feature_op"].url, json=body)
        _raise_for(response)
        return op_from_dict(response.json())

    async def warmup(self) -> None:
        return None  # the server warmed its engine at start-up

    async def shutdown(self) -> None:
        return None  # the server outlives its clients; stop it where it was started


def _generation(data: Mapping[str, Any]) -> Generation:
    return Generation(tuple(data["prompt_ids"]), tuple(data["token_ids"]), data["text"])


def _refuse_logprobs(sampling: SamplingParams | None) -> None:
    """The HTTP routes do not carry per-step logprobs yet: refuse rather than drop them."""
    if sampling is not None and sampling.logprobs is not None:
        raise UnsupportedOperationError(
            "backend 'remote' does not carry per-step logprobs over HTTP; load the model "
            "in-process (backend='vllm' or 'eager') for SamplingParams(logprobs=k)"
        )


def load(model_id: str, **kw: Any) -> RemoteModel:
    """Entry point `remote`: `model_id` is the server's base URL (`http://host:port`)."""
    if not model_id.startswith(("http://", "https://")):
        raise ValueError(
            f"backend 'remote' takes the server's URL (http://host:port), got {model_id!r}; "
            "start a server with `ie serve MODEL`"
        )
    return RemoteModel.connect(model_id, **kw)


__all__ = ["API_KEY_ENV", "BACKEND", "RemoteError", "RemoteModel", "load"]
