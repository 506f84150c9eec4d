"""What one HTTP request may ask of the server, checked before any work is done for it.

A text prompt's byte length bounds its token count (no token covers more bytes than the
tokenizer's longest entry), so a text that cannot fit `max_model_len` is refused before it is
tokenized; a request's response size (captured rows, logits, top-k) is computed from its token
counts and widths and refused over `--ie-max-response-mib`; sampling values are checked against
vLLM's own ranges and residual rows against the dtypes the lens math runs in.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from ie_core.grammar import Width, get_point, to_address

from ie_vllm.server.http_errors import BadRequest

RESPONSE_ENV = "IE_MAX_RESPONSE_MIB"
DEFAULT_RESPONSE_MIB = 256
ELEMENT_BYTES = 4  # captures are counted as fp32, an upper bound for fp16 / bf16 models
ROW_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
MiB = 2**20


@dataclass(frozen=True)
class Limits:
    """One server's limits: its context, its tokenizer's longest token, its response cap."""

    max_model_len: int
    max_token_bytes: int
    max_response_bytes: int

    @property
    def max_text_bytes(self) -> int:
        return self.max_model_len * self.max_token_bytes


def response_cap_bytes(environ: Mapping[str, str] = os.environ) -> int:
    """`--ie-max-response-mib` as `ie serve` passed it (`RESPONSE_ENV`), in bytes."""
    raw = environ.get(RESPONSE_ENV) or str(DEFAULT_RESPONSE_MIB)
    return int(float(raw) * MiB)


def longest_token_bytes(tokenizer: Any) -> int:
    """UTF-8 bytes of the tokenizer's longest vocabulary entry (>= the text any token covers)."""
    vocab = tokenizer.get_vocab()
    return max((len(str(t).encode("utf-8")) for t in vocab), default=1) or 1


def limits_for(model: Any, max_model_len: int) -> Limits:
    return Limits(max_model_len, longest_token_bytes(model.tokenizer), response_cap_bytes())


def parse_json(body: bytes) -> Any:
    """The body's JSON; a body nested past Python's parser is a 400, not a RecursionError."""
    try:
        return json.loads(body)
    except RecursionError:
        raise BadRequest("the request body's JSON is nested too deeply to parse") from None


def text_bytes(texts: Iterable[str]) -> int:
    return sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)


def check_text(limits: Limits, n_bytes: int, where: str) -> None:
    """Refuse text that cannot fit the context, before tokenizing it (which blocks a thread)."""
    if n_bytes > limits.max_text_bytes:
        raise BadRequest(
            f"{where} holds {n_bytes} bytes of text: more than max_model_len="
            f"{limits.max_model_len} tokens of at most {limits.max_token_bytes} bytes each "
            f"({limits.max_text_bytes} bytes), so it is refused before tokenizing; shorten it "
            "or send token ids"
        )


def check_response(limits: Limits, n_bytes: int, what: str) -> None:
    if n_bytes > limits.max_response_bytes:
        raise BadRequest(
            f"{what} would return {n_bytes / MiB:.1f} MiB, over this server's "
            f"--ie-max-response-mib={limits.max_response_bytes / MiB:g}; ask for fewer prompts, "
            "tokens or addresses per request, or start the server with a larger cap",
            413,
        )


def capture_bytes(widths: Mapping[str, int], addresses: Iterable[str], lengths: list[int]) -> int:
    """Bytes of the rows a capture over prompts of `lengths` tokens returns."""
    total = 0
    for address in addresses:
        width = widths.get(address, 0)
        per_layer = get_point(to_address(address).name).width is Width.HQK
        for n in lengths:
            total += n * width * (n if per_layer else 1) * ELEMENT_BYTES
    return total


def check_sampling(sampling: Any) -> None:
    """vLLM's own range checks, run here so a bad value is a 400 before anything is submitted."""
    from vllm import SamplingParams

    SamplingParams(
        max_tokens=sampling.max_new_tokens,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        seed=sampling.seed,
    )


def check_rows(rows: Any, d_model: int) -> None:
    """Residual rows the lens can decode: floating point, `[..., d_model]`."""
    if not isinstance(rows, torch.Tensor) or rows.dtype not in ROW_DTYPES:
        dtype = getattr(rows, "dtype", type(rows).__name__)
        names = ", ".join(str(d).removeprefix("torch.") for d in ROW_DTYPES)
        raise BadRequest(f"'rows' must be one of {names}, got {dtype}")
    if rows.dim() == 0 or rows.shape[-1] != d_model:
        raise BadRequest(f"'rows' must be [..., {d_model}] (d_model), got {list(rows.shape)}")


__all__ = [
    "DEFAULT_RESPONSE_MIB",
    "RESPONSE_ENV",
    "Limits",
    "capture_bytes",
    "check_response",
    "check_rows",
    "check_sampling",
    "check_text",
    "limits_for",
    "parse_json",
    "response_cap_bytes",
    "text_bytes",
]
