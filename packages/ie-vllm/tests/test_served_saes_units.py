"""`ie serve --sae NAME=SOURCE` without an engine: argument parsing, start-up loading against
the served model's widths (a mismatch stops the server naming it), and named feature ops
resolved into the ops `ie_core.experiments.features` builds (compared field by field)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ie_core.errors import DictionaryError, DictionaryShapeError, SteeringSpecError
from ie_core.experiments.features import feature_ablate, feature_clamp, feature_steer
from ie_core.experiments.saes import from_tensors
from ie_core.wire import steering_from_wire
from ie_vllm.server.served_saes import load_served, parse_sae_args, resolve_steering, sae_env

D, F = 8, 12


def _weights(d: int = D) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"W_enc": torch.randn(d, F, generator=g), "b_enc": torch.randn(F, generator=g),
            "W_dec": torch.randn(F, d, generator=g), "b_dec": torch.zeros(d)}  # fmt: skip


def _folder(tmp: Path, d: int = D) -> Path:
    from safetensors.torch import save_file

    tmp.mkdir(parents=True, exist_ok=True)
    save_file(_weights(d), str(tmp / "sae_weights.safetensors"))
    (tmp / "cfg.json").write_text(json.dumps({"hook_name": "blocks.1.hook_resid_post"}))
    return tmp


class _Model:
    architecture = "LlamaForCausalLM"

    def point_width(self, address: str) -> int:
        return D


def test_sae_arguments_are_name_source_pairs() -> None:
    assert parse_sae_args(["a=/x", "b.2=org/repo/sub"]) == [("a", "/x"), ("b.2", "org/repo/sub")]
    for bad, why in [("a", "NAME=SOURCE"), ("=x", "name"), ("a b=x", "name"), ("a=", "NAME")]:
        with pytest.raises(SystemExit, match=why):
            parse_sae_args([bad])
    with pytest.raises(SystemExit, match="twice"):
        parse_sae_args(["a=/x", "a=/y"])


def test_dictionaries_load_at_start_up_and_a_wrong_width_stops_the_server(tmp_path: Path) -> None:
    good = _folder(tmp_path / "good")
    saes = load_served(_Model(), sae_env([("res1", str(good))]))
    assert list(saes) == ["res1"] and saes["res1"].address == "resid_post.1"
    assert load_served(_Model(), None) == {}
    wide = _folder(tmp_path / "wide", d=D + 2)
    with pytest.raises(RuntimeError, match=r"--sae bad=.*10-wide rows but resid_post.1 is 8"):
        load_served(_Model(), sae_env([("bad", str(wide))]))
    with pytest.raises(RuntimeError, match="--sae gone="):
        load_served(_Model(), sae_env([("gone", str(tmp_path / "missing"))]))


def _spec(*ops: dict) -> list[dict]:
    return [{"point": "resid_post", "layers": [1], "ops": list(ops)}]


def test_named_ops_become_the_ops_features_builds() -> None:
    sae = from_tensors(_weights(), address="resid_post.1")
    saes = {"s": sae}
    named = _spec(
        {"kind": "feature_steer", "sae": "s", "feature": 3, "coeff": 2.5},
        {"kind": "feature_clamp", "sae": "s", "feature": 4, "value": 1.5},
        {"kind": "feature_ablate", "sae": "s", "feature": 5},
        {"kind": "scale", "factor": 2.0},  # a plain op passes through untouched
        feature_clamp(sae, 6, 1.0).to_wire(),  # a plain FeatureClamp shares the kind name
    )
    (spec,) = steering_from_wire(resolve_steering(named, saes))
    want = [feature_steer(sae, 3, 2.5), feature_clamp(sae, 4, 1.5), feature_ablate(sae, 5)]
    assert [o.to_wire() for o in spec.ops[:3]] == [o.to_wire() for o in want]
    assert spec.ops[3].kind == "scale" and spec.ops[4] == feature_clamp(sae, 6, 1.0)
    # Negative control: another feature's decoder row is a different op.
    assert spec.ops[0].to_wire() != feature_steer(sae, 2, 2.5).to_wire()


@pytest.mark.parametrize(
    ("op", "error", "match"),
    [
        ({"kind": "feature_steer", "sae": "nope", "feature": 1}, DictionaryError, "served: s"),
        ({"kind": "feature_steer", "sae": "s", "feature": F}, DictionaryShapeError, "outside"),
        ({"kind": "feature_steer", "sae": "s", "feature": "1"}, SteeringSpecError, "integer"),
        (
            {"kind": "feature_steer", "sae": "s", "feature": 1, "coeff": "2"},
            SteeringSpecError,
            "real number",
        ),
        ({"kind": "feature_clamp", "sae": "s", "feature": 1}, SteeringSpecError, "value"),
        ({"kind": "feature_ablate", "sae": "s", "feature": 1, "x": 0}, SteeringSpecError, "not"),
    ],
)
def test_bad_named_ops_are_refused_with_the_reason(op: dict, error: type, match: str) -> None:
    saes = {"s": from_tensors(_weights(), address="resid_post.1")}
    with pytest.raises(error, match=match):
        resolve_steering(_spec(op), saes)
