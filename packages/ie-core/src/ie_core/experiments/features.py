"""Dictionary features on any backend: `feature_activations` (dense or top-k per token, with the
reconstruction statistics on request) and the feature steering ops `feature_steer` (an
`Additive` with the decoder row), `feature_clamp` and `feature_ablate` (a `FeatureClamp`), and
`when_feature` (any op, applied only where a feature fires: a `Conditional`).

Every backend encodes where the rows live (`ModelFront.dictionary_features`, the reducer
`ie_core.reduce.dictionary.DictionaryFeatures`: in the vLLM workers, eager's forward, or the
server's workers for a served name) and ships only the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ie_core.active_steering import with_active
from ie_core.errors import DictionaryShapeError, SteeringSpecError, UnsupportedOperationError
from ie_core.experiments.saes import SAE
from ie_core.ops import Additive, Conditional, FeatureClamp, Op
from ie_core.ops.values import real_number
from ie_core.protocol import InterpModel, Prompt, SteeringArg
from ie_core.runner import run
from ie_core.sync import ModelLike, unwrap


@dataclass(frozen=True)
class Features:
    """One dictionary's read-out, `[batch, seq, ...]`: dense `acts`, or top-k `ids` / `values`;
    `sq_error` / `sq_norm` (`[batch, seq]`) when asked for stats."""

    acts: torch.Tensor | None = None
    ids: torch.Tensor | None = None
    values: torch.Tensor | None = None
    sq_error: torch.Tensor | None = None
    sq_norm: torch.Tensor | None = None

    @property
    def fve(self) -> torch.Tensor:
        """Fraction of variance explained per token: 1 - |x - x_hat|^2 / |x - mean(x)|^2."""
        if self.sq_error is None or self.sq_norm is None:
            raise ValueError(
                "ask feature_activations(..., stats=True) for the reconstruction stats"
            )
        return 1.0 - self.sq_error / self.sq_norm

    @classmethod
    def from_outputs(cls, out: Mapping[str, torch.Tensor]) -> Features:
        return cls(*(out.get(n) for n in ("acts", "ids", "values", "sq_error", "sq_norm")))


def check_dictionary(model: Any, sae: SAE, stats: bool = False) -> None:
    """Refuse, before any forward, a dictionary whose width does not match its point here."""
    width = model.point_width(sae.address)
    if width != sae.d_in:
        raise DictionaryShapeError(
            f"{sae.name or 'the dictionary'} reads {sae.d_in}-wide rows but {sae.address} is "
            f"{width} wide on {getattr(model, 'architecture', None) or 'this model'}; load the dictionary trained for this model"
        )
    if stats and sae.is_transcoder:
        raise UnsupportedOperationError(
            "reconstruction stats compare the input with its reconstruction; a transcoder "
            f"predicts {sae.out_address} from {sae.address}, so capture {sae.out_address} and "
            "compare with sae_math.decode instead"
        )


def feature_activations(
    model: ModelLike,
    prompts: Prompt | Sequence[Sequence[int]],
    sae: SAE | str | Mapping[str, SAE] | Mapping[str, str],
    k: int | None = None,
    *,
    stats: bool = False,
    steering: SteeringArg = None,
) -> Any:
    """Features of `sae` (or of each dictionary in a name -> SAE mapping: a dict of results).

    A string names a dictionary the server serves (`ie serve --sae NAME=SOURCE`, backend
    `remote`): the encode runs there and only the result comes back."""
    steering = with_active(model, steering)
    return _activations(unwrap(model), prompts, sae, k, stats, steering)


def _activations(
    model: InterpModel, prompts: Any, sae: Any, k: int | None, stats: bool, steering: Any
) -> Any:
    many = not isinstance(sae, SAE | str)
    saes: dict[str, Any] = dict(sae) if many else {"sae": sae}  # type: ignore[arg-type]
    if k is not None and k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    named = [isinstance(s, str) for s in saes.values()]
    if any(named) and not all(named):
        raise TypeError("give either served dictionary names or loaded SAEs, not a mix")
    for one in saes.values():
        if not isinstance(one, str):
            check_dictionary(model, one, stats)
    raw = run(model.dictionary_features(prompts, saes, k=k, stats=stats, steering=steering))
    out = {n: Features.from_outputs(raw[n]) for n in saes}
    return out if many else out["sae"]


def feature_steer(sae: SAE, feature: int, coeff: float = 1.0) -> Additive:
    """Add `coeff * W_dec[feature]` (write at `sae.out_address`)."""
    return Additive(sae.decoder_row(feature).tolist(), coeff)


def feature_clamp(sae: SAE, feature: int, value: float) -> FeatureClamp:
    """Set `feature` to `value`, keeping the reconstruction error (write at `sae.address`)."""
    sae.check_feature(feature)
    why = _clamp_refusal(sae)
    if why:
        raise UnsupportedOperationError(f"FeatureClamp on this dictionary: {why}")
    w = sae.weights
    enc = w["W_enc"][:, feature].float()
    bias = float(w["b_enc"][feature])
    if sae.meta.b_dec_in:
        bias -= float(w["b_dec"].float() @ enc)
    thr = float(w["threshold"][feature]) if sae.meta.activation == "jumprelu" else 0.0
    return FeatureClamp(enc.tolist(), sae.decoder_row(feature).tolist(), bias, thr, float(value))


def feature_ablate(sae: SAE, feature: int) -> FeatureClamp:
    """Set `feature` to 0, keeping the reconstruction error."""
    return feature_clamp(sae, feature, 0.0)


def when_feature(sae: SAE, feature: int, op: Op, threshold: float = 0.0) -> Conditional:
    """`op` only on the tokens where `feature`'s activation is above `threshold`. The condition
    reads `sae.address` (where the feature reads); place the op there or at any point computed
    after it in the same forward. A point computed before `sae.address` (an earlier layer, an
    earlier point of its block) is refused with `ConditionPointError`.

    ReLU / JumpReLU features are functions of their own encoder column, so the condition is the
    probe `h . W_enc[:, feature] + b` with b = b_enc[feature] (- b_dec . W_enc[:, feature] where
    the dictionary subtracts b_dec first): a(h) > t >= 0 holds exactly where that score passes
    max(t, the JumpReLU threshold)."""
    sae.check_feature(feature)
    why = _condition_refusal(sae)
    if why:
        raise UnsupportedOperationError(f"a feature condition on this dictionary: {why}")
    t = real_number(threshold, "threshold")
    if t < 0:
        raise SteeringSpecError(
            f"threshold {t} is below 0, and a feature's activation never is, so the condition "
            "would always hold; apply the op unconditionally instead"
        )
    w = sae.weights
    enc = w["W_enc"][:, feature].double()
    bias = float(w["b_enc"][feature])
    if sae.meta.b_dec_in:
        bias -= float(w["b_dec"].double() @ enc)
    if sae.meta.activation == "jumprelu":
        t = max(t, float(w["threshold"][feature]))
    return Conditional(op, enc.tolist(), bias, t, "relu", read=sae.address)


def _condition_refusal(sae: SAE) -> str:
    if sae.meta.activation == "topk":
        return ("a TopK feature depends on every other feature (membership of the top k), so "
                "it is not a function of its own encoder column; use a linear probe "
                "(Conditional) instead")  # fmt: skip
    if sae.meta.normalize != "none":
        return "input normalisation makes the feature non-linear in the row; use a Conditional"
    return ""


def _clamp_refusal(sae: SAE) -> str:
    if sae.is_transcoder:
        return ("a transcoder reads one point and writes another; steer its output with "
                "feature_steer at out_address instead")  # fmt: skip
    if sae.meta.activation == "topk":
        return ("a TopK feature depends on every other feature (membership of the top k), so "
                "it is not a function of its own encoder column; use feature_steer")  # fmt: skip
    if sae.meta.normalize != "none":
        return "input normalisation makes the feature non-linear in the row; use feature_steer"
    return ""


__all__ = [
    "Features",
    "check_dictionary",
    "feature_ablate",
    "feature_activations",
    "feature_clamp",
    "feature_steer",
    "when_feature",
]
