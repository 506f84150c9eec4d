"""Every error ie-core raises, so callers can catch by kind. Messages say what, why, and what to do."""

from __future__ import annotations


class InterpError(Exception):
    """Base of every error this project raises on purpose."""


# --- addresses -------------------------------------------------------------------------------


class AddressError(ValueError, InterpError):
    """A malformed address. `text` holds the offending input."""

    def __init__(self, message: str, text: object = None) -> None:
        super().__init__(message)
        self.text = text


class EmptyNameError(AddressError):
    """The point name is empty."""


class InvalidNameError(AddressError):
    """The point name is not `[a-z][a-z0-9_]*`."""


class NegativeLayerError(AddressError):
    """A layer index below zero."""


class UnknownCoordinateError(AddressError):
    """A trailing component that is neither a layer nor `stream-N`."""


class LegacySyntaxError(AddressError):
    """The `name:layer` form; addresses use dots."""


class UnknownPointError(AddressError):
    """A name that is not one of the 34 points (and not a `path.` address)."""


class LayerOnTrunkPointError(AddressError):
    """A layer given for a trunk-level point such as `embeddings`."""


class MissingLayerError(AddressError):
    """A per-layer point written without its layer."""


class LayerOutOfRangeError(AddressError):
    """A layer at or beyond the model's `n_layers`."""


# --- models and backends ---------------------------------------------------------------------


class PointUnavailableError(InterpError):
    """The model or backend cannot produce this point; the message says why and what to use.

    `reason` is the why alone, without the address, so one reason can stand for every layer a
    backend refuses (the capability answers carry it)."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = message if reason is None else reason


class BackendNotInstalledError(InterpError, ImportError):
    """A backend name whose package is not installed."""


class ModelNotFoundError(InterpError, FileNotFoundError):
    """A model id that cannot be resolved to weights on this machine."""


class UnsupportedOperationError(InterpError, NotImplementedError):
    """The backend refuses an operation (e.g. capture on `vllm-generate`), naming an alternative."""


class GradientUnavailableError(UnsupportedOperationError):
    """A gradient asked of a backend whose forward runs without autograd (vLLM's engines run
    under inference mode in their own processes); use backend='eager' with grad=True."""


class UnsupportedEngineError(InterpError, RuntimeError):
    """A vLLM engine configuration the worker code cannot run on (Model Runner V2, or an option
    that forces it); the message names what to change."""


class UnsupportedModelError(InterpError, ValueError):
    """A checkpoint that is not a decoder-only causal LM (BERT, T5, ...): nothing to generate."""


class ModelClosedError(InterpError, RuntimeError):
    """A model used after `shutdown()`; load it again."""


class BadPromptError(InterpError, ValueError, TypeError):
    """A prompt that is empty, not text or ids, or holds ids outside the vocabulary."""


class PromptTooLongError(BadPromptError):
    """A prompt (plus the tokens to generate) longer than the model's positions (eager) or the
    engine's context length (`max_model_len`, vLLM)."""


class SamplingParamsError(InterpError, ValueError, TypeError):
    """Sampling settings of the wrong type or out of range (refused at construction)."""


# --- engines ---------------------------------------------------------------------------------


class EngineStoppedError(InterpError, RuntimeError):
    """The model's engine no longer serves requests; load the model again to continue."""


class EngineShutdownError(EngineStoppedError, ModelClosedError):
    """A request was in flight (or made) after its engine was shut down."""


class EngineDeadError(EngineStoppedError):
    """The engine's process died; requests in flight fail and the model must be loaded again."""


# --- steering --------------------------------------------------------------------------------


class SteeringSpecError(ValueError, InterpError):
    """A steering spec refused at construction or when bound to a model (width, values, op)."""


class ConditionPointError(SteeringSpecError):
    """A `Conditional` whose condition reads a point that is not computed before the one it
    steers (a condition is judged earlier in the same forward than the write)."""


class NotAwaitedError(InterpError, TypeError, AttributeError):
    """An async model method's result used without `await` (see ie_core.awaitable)."""


class DictionaryError(ValueError, InterpError):
    """A sparse dictionary (SAE / transcoder) that cannot be loaded or used as given."""


class DictionaryFormatError(DictionaryError):
    """A dictionary folder or config in no format `load_sae` reads, or missing a tensor."""


class DictionaryShapeError(DictionaryError):
    """A dictionary's tensors disagree with each other or with the point they read / write."""


class DictionaryDtypeError(DictionaryError):
    """A dictionary tensor of a dtype that is not floating point."""


class DictionaryAddressError(DictionaryError):
    """A dictionary's hook name maps to no point, or names a point the model does not serve."""
