"""What the eager backend will load: a decoder-only causal LM, refused with a named error otherwise.

Checks run in the order the load reaches them: the folder holds an HF config, the config is not
an encoder-decoder or a non-causal task head (before any weights are read), the weights exist,
and finally the loaded model is causal in fact: its output at a position does not change when a
later token does. That last probe is what catches a BERT checkpoint that transformers would
happily wrap in a `BertLMHeadModel`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, cast

import torch
from ie_core.errors import ModelNotFoundError, UnsupportedModelError
from torch import nn

SUPPORTED = (
    "the eager backend serves decoder-only causal language models (GPT-2, Llama, Mistral, "
    "Qwen, Gemma, Phi, OLMo, ...; the registered families are listed in "
    "docs/SUPPORTED_POINTS.md)"
)
# Task heads that are not next-token prediction; a checkpoint saved only as one of them is
# refused before its weights are read.
_NON_CAUSAL_HEAD = re.compile(
    r".*For(MaskedLM|SequenceClassification|TokenClassification|QuestionAnswering|"
    r"MultipleChoice|NextSentencePrediction|PreTraining|Seq2SeqLM|SpeechSeq2Seq|CTC)$"
)


def read_config(name: str, source: Any, hub: dict[str, Any]) -> Any:
    """The HF config of `source`, or a named error saying what the folder or id lacks. `hub`
    holds the Hub download options (revision, token, cache_dir, local_files_only) for ids."""
    from transformers import AutoConfig

    folder = Path(source) if isinstance(source, Path) else None
    if folder is not None and not (folder / "config.json").is_file():
        raise ModelNotFoundError(
            f"{name!r} is a folder but holds no config.json, so it is not a Hugging Face model "
            "folder; pass the folder that contains config.json and the weights"
        )
    if folder is None and (unreachable := hub_unreachable(str(source), hub)):
        raise ModelNotFoundError(f"cannot download {name!r}: {unreachable}; {_WHAT_TO_DO}")
    try:
        config = AutoConfig.from_pretrained(source, **hub)
    except OSError as exc:
        why = " ".join(str(exc).split())
        raise ModelNotFoundError(
            f"cannot find {name!r} locally or on the Hugging Face Hub; {_WHAT_TO_DO} "
            f"(transformers said: {why})"
        ) from None
    except ValueError as exc:
        raise UnsupportedModelError(
            f"{name!r} has a config transformers cannot read as a model ({exc}); {SUPPORTED}"
        ) from None
    check_config(name, config)
    return config


_WHAT_TO_DO = (
    "pass a local folder (config.json and weights), an ie-synthetic/<family> id (random weights, "
    "offline) or a Hub id; downloads need the network unless the model is in the Hugging Face "
    "cache, and HF_HUB_OFFLINE=1 reads only that cache"
)


def hub_unreachable(repo_id: str, hub: dict[str, Any], timeout_s: float = 3.0) -> str | None:
    """Why the Hub cannot be reached for an id not in the HF cache, or None to go ahead.

    One quick connection instead of huggingface_hub's five retries (~40 s of backoff) offline."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants, try_to_load_from_cache

    if constants.HF_HUB_OFFLINE or hub.get("local_files_only"):
        return None  # transformers reads the cache only, and says so itself
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None  # a proxy may reach what a direct connection cannot
    cached = try_to_load_from_cache(
        repo_id, "config.json", cache_dir=hub.get("cache_dir"), revision=hub.get("revision")
    )
    if isinstance(cached, str):
        return None
    url = urlparse(constants.ENDPOINT)
    host, port = (
        url.hostname or "huggingface.co",
        url.port or (443 if url.scheme == "https" else 80),
    )
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        return f"{host}:{port} is unreachable ({exc})"
    return None


def check_config(name: str, config: Any) -> None:
    """Refuse encoder-decoders and checkpoints saved only as non-causal task heads."""
    model_type = getattr(config, "model_type", "?")
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            f"{name!r} is an encoder-decoder model ({model_type}); {SUPPORTED}"
        )
    archs = list(getattr(config, "architectures", None) or [])
    if archs and all(_NON_CAUSAL_HEAD.fullmatch(a) for a in archs):
        raise UnsupportedModelError(
            f"{name!r} is a {', '.join(archs)} checkpoint, not a causal language model; {SUPPORTED}"
        )


def load_weights(name: str, source: Any, hub: dict[str, Any], **kw: Any) -> nn.Module:
    """`AutoModelForCausalLM.from_pretrained` with its errors turned into named ones."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(source, **hub, **kw)
    except OSError as exc:
        raise ModelNotFoundError(
            f"{name!r} has a config but its weights could not be read ({exc}); the folder needs "
            "model.safetensors (or pytorch_model.bin) next to config.json"
        ) from None
    except ValueError as exc:
        if "Unrecognized configuration class" in str(exc):
            raise UnsupportedModelError(
                f"{name!r} ({type(exc).__name__}: transformers has no causal-LM class for it); "
                f"{SUPPORTED}"
            ) from None
        raise


def check_causal(name: str, model: nn.Module) -> None:
    """Refuse a model whose early outputs depend on later tokens (bidirectional attention)."""
    vocab = int(cast(Any, model).get_input_embeddings().weight.shape[0])
    if vocab < 4:
        return
    device = next(model.parameters()).device
    a = torch.tensor([[1, 2, 3]], device=device)
    b = torch.tensor([[1, 2, vocab - 1]], device=device)
    with torch.no_grad():
        la = model(input_ids=a, use_cache=False).logits[0, :2].float()
        lb = model(input_ids=b, use_cache=False).logits[0, :2].float()
    scale = max(float(la.abs().max()), 1e-6)
    if not torch.allclose(la, lb, rtol=1e-3, atol=1e-3 * scale):
        raise UnsupportedModelError(
            f"{name!r} ({type(model).__name__}) is not a causal language model: its outputs at "
            "the first positions changed when a later token changed, so it attends in both "
            f"directions (like BERT); {SUPPORTED}"
        )
