"""Ops: what a request writes at a point. Each op is one module holding its validation, its row
update, its dtype-range peak, its wire form and (where affine) vllm-static's form; `kinds`
registers them; `steering` groups ops at a point and layers. Torch-free at import; `apply` runs
ops on tensors (and imports torch)."""

from ie_core.ops.additive import Additive
from ie_core.ops.base import AffineForm, Op, Replacement
from ie_core.ops.conditional import Conditional
from ie_core.ops.feature_clamp import ROW_NORM_MAX, FeatureClamp, delta_bound
from ie_core.ops.heads import check_heads
from ie_core.ops.hook import Hook
from ie_core.ops.kinds import OP_KINDS, SteeringOp, op_from_dict
from ie_core.ops.lens_ablate import LensAblate
from ie_core.ops.lens_steer import LensSteer
from ie_core.ops.lens_swap import LensSwap
from ie_core.ops.orthogonal import Orthogonal
from ie_core.ops.patch import Patch
from ie_core.ops.projection_cap import ProjectionCap
from ie_core.ops.scale import Scale
from ie_core.ops.steering import PositionMask, Steering, steer_at
from ie_core.ops.transcoder_clamp import TranscoderClamp
from ie_core.ops.values import VectorLike

__all__ = [
    "OP_KINDS",
    "ROW_NORM_MAX",
    "Additive",
    "AffineForm",
    "Conditional",
    "FeatureClamp",
    "Hook",
    "LensAblate",
    "LensSteer",
    "LensSwap",
    "Op",
    "Orthogonal",
    "Patch",
    "PositionMask",
    "ProjectionCap",
    "Replacement",
    "Scale",
    "Steering",
    "SteeringOp",
    "TranscoderClamp",
    "VectorLike",
    "check_heads",
    "delta_bound",
    "op_from_dict",
    "steer_at",
]
