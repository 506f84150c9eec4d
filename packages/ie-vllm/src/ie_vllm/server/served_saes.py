"""Dictionaries served by `ie serve --sae NAME=SOURCE`: the start-up arguments, loading them
against the served model (a width that does not match its point stops the server with the
reason), and named feature ops in a request's steering resolved into the plain ops.

A named op is a steering op object carrying `sae`: `{"kind": "feature_steer", "sae": NAME, "feature": F,
"coeff": C}`, `{"kind": "feature_clamp", "sae": NAME, "feature": F, "value": V}` or
`{"kind": "feature_ablate", "sae": NAME, "feature": F}`, or `{"kind": "when_feature", "sae": NAME,
"feature": F, "threshold": T, "op": OP}` (OP, itself plain or named, applied only where the feature's
activation passes T); it becomes the `Additive` / `FeatureClamp` / `Conditional` that
`ie_core.experiments.features` builds from the dictionary, so it is checked and applied exactly as
the same op sent in full.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ie_core.errors import DictionaryError, SteeringSpecError
from ie_core.experiments.features import (
    check_dictionary,
    feature_ablate,
    feature_clamp,
    feature_steer,
    when_feature,
)
from ie_core.experiments.saes import SAE, load_sae
from ie_core.ops.kinds import op_from_dict
from ie_core.ops.values import real_number
from ie_core.reduce import DictionaryFeatures, Reduction

SAES_ENV = "IE_SERVE_SAES"
NAMED_KINDS = ("feature_steer", "feature_clamp", "feature_ablate", "when_feature")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def parse_sae_args(values: Sequence[str]) -> list[tuple[str, str]]:
    """`NAME=SOURCE` pairs from `--sae` (SystemExit with the reason for a malformed one)."""
    out: dict[str, str] = {}
    for value in values:
        name, sep, source = value.partition("=")
        if not sep or not source:
            raise SystemExit(f"ie serve: --sae {value!r} is not NAME=SOURCE (a folder or Hub id)")
        if not _NAME.fullmatch(name):
            raise SystemExit(
                f"ie serve: --sae name {name!r} must be 1-64 letters, digits, '_', '.' or '-'"
            )
        if name in out:
            raise SystemExit(f"ie serve: --sae {name} is given twice")
        out[name] = source
    return list(out.items())


def sae_env(pairs: Sequence[tuple[str, str]]) -> str:
    return json.dumps([list(p) for p in pairs])


def load_served(model: Any, raw: str | None) -> dict[str, SAE]:
    """Every `--sae` dictionary, loaded and checked against `model` (RuntimeError naming it)."""
    saes: dict[str, SAE] = {}
    for name, source in json.loads(raw) if raw else []:
        try:
            sae = load_sae(source)
            check_dictionary(model, sae)
        except (DictionaryError, OSError, ValueError) as exc:
            raise RuntimeError(f"ie serve --sae {name}={source}: {exc}") from exc
        saes[name] = sae
    return saes


def describe(saes: Mapping[str, SAE]) -> dict[str, Any]:
    """What `/v1/ie/saes` lists per name."""
    return {
        name: {
            "address": s.address,
            "out_address": s.out_address,
            "d_in": s.d_in,
            "d_sae": s.d_sae,
            "activation": s.meta.activation,
            "k": s.meta.k,
            "key": s.key,
        }
        for name, s in saes.items()
    }


def served(saes: Mapping[str, SAE], name: Any) -> SAE:
    """The dictionary served as `name`, or a DictionaryError listing the served names."""
    if not isinstance(name, str) or name not in saes:
        names = ", ".join(sorted(saes)) or "none (start the server with --sae NAME=SOURCE)"
        raise DictionaryError(f"no dictionary is served as {str(name)[:80]!r}; served: {names}")
    return saes[name]


def _feature(data: Mapping[str, Any]) -> int:
    f = data.get("feature")
    if not isinstance(f, int) or isinstance(f, bool):
        raise SteeringSpecError(f"a named feature op needs an integer 'feature', got {f!r:.40}")
    return f


def named_op(data: Mapping[str, Any], saes: Mapping[str, SAE]) -> dict[str, Any]:
    """One named feature op as the plain op's wire form."""
    kind = data["kind"]
    extra = {"feature_steer": {"coeff"}, "feature_clamp": {"value"},
             "when_feature": {"op", "threshold"}}.get(kind, set())  # fmt: skip
    unknown = set(data) - {"kind", "sae", "feature", *extra}
    if unknown:
        raise SteeringSpecError(
            f"{kind} takes kind, sae, feature{''.join(', ' + e for e in sorted(extra))}; "
            f"not {sorted(unknown)}"
        )
    sae, f = served(saes, data.get("sae")), _feature(data)
    if kind == "feature_steer":
        return feature_steer(sae, f, real_number(data.get("coeff", 1.0), "coeff")).to_wire()
    if kind == "feature_clamp":
        if "value" not in data:
            raise SteeringSpecError("feature_clamp needs a 'value' for the feature")
        return feature_clamp(sae, f, real_number(data["value"], "value")).to_wire()
    if kind == "when_feature":
        inner = data.get("op")
        if not isinstance(inner, dict):
            raise SteeringSpecError(
                f"when_feature needs an 'op' object to apply, got {inner!r:.40}"
            )
        op = op_from_dict(named_op(inner, saes) if _is_named(inner) else inner)
        threshold = real_number(data.get("threshold", 0.0), "threshold")
        return when_feature(sae, f, op, threshold).to_wire()
    return feature_ablate(sae, f).to_wire()


def resolve_steering(data: Any, saes: Mapping[str, SAE]) -> Any:
    """The steering list with every named feature op replaced (anything else is left for
    `steering_from_wire` to judge)."""
    if not isinstance(data, list):
        return data
    out = []
    for spec in data:
        ops = spec.get("ops") if isinstance(spec, dict) else None
        if isinstance(ops, list):
            ops = [named_op(op, saes) if _is_named(op) else op for op in ops]
            spec = {**spec, "ops": ops}
        out.append(spec)
    return out


def _is_named(op: Any) -> bool:
    """A named op carries `sae`; a plain `FeatureClamp` shares its kind but carries vectors."""
    return isinstance(op, dict) and op.get("kind") in NAMED_KINDS and "sae" in op


def resolve_reductions(
    reductions: Sequence[Reduction], saes: Mapping[str, SAE]
) -> tuple[Reduction, ...]:
    """A plan's reductions with each served dictionary named by the client made its loaded
    dictionary, read at its own point; a name not served, or a k outside the dictionary, is
    refused before any forward."""
    out = []
    for r in reductions:
        named = r.reducer
        if isinstance(named, DictionaryFeatures) and named.sae is None:
            sae = served(saes, named.dictionary)
            k = named.k
            if k is not None and (
                not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= sae.d_sae
            ):
                raise SteeringSpecError(
                    f"k must be an integer from 1 to the dictionary's {sae.d_sae}, got {k!r:.40}"
                )
            if not isinstance(named.stats, bool):
                raise SteeringSpecError("'stats' must be true or false")
            r = replace(r, address=sae.address, reducer=replace(named, dictionary=sae.key, sae=sae))
        out.append(r)
    return tuple(out)


__all__ = [
    "NAMED_KINDS",
    "SAES_ENV",
    "describe",
    "load_served",
    "named_op",
    "parse_sae_args",
    "resolve_reductions",
    "resolve_steering",
    "sae_env",
    "served",
]
