"""Every public free function of ie_core takes the async model and its `SyncModel` alike.

The surface is read from each ie_core module's `__all__` (functions whose first parameter is the
model), so a new free function without a row in CALLS fails here. Each row runs once with the
model and once with `SyncModel(model)`; the two outcomes (results, or the refusal) must be equal.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import ie_core
import pytest
import torch
from eager_harvest_support import OPTIONS, POINTS, write_corpus
from eager_support import synthetic_model
from ie_core.active_steering import steer, with_active
from ie_core.api import (
    capture,
    capture_attention,
    capture_generation,
    decode_residuals,
    generate,
    run_with_cache,
)
from ie_core.atlas import atlas, open_atlas
from ie_core.circuits import (
    TranscoderSet,
    attribute,
    attribute_many,
    intervene,
    prepare,
    prepare_many,
    random_transcoder,
)
from ie_core.circuits.attribution import graph_of
from ie_core.circuits.qk import qk_weights_for
from ie_core.circuits.weights import weights_for
from ie_core.experiments.analysis import chat_spans
from ie_core.experiments.feature_stream import stream_features
from ie_core.experiments.features import check_dictionary, feature_activations
from ie_core.experiments.jacobian_lens import JacobianLens, ajacobian_lens_topk, jacobian_lens_topk
from ie_core.experiments.lens_stream import lens_transports, stream_lens
from ie_core.experiments.patching import (
    answer_logprobs,
    answer_tokens,
    decode_rows,
    final_logits,
    logit_diff,
    mean_activation,
    mean_activation_async,
    patch_sweep,
    patch_sweep_async,
    prompt_token_ids,
    single_token,
)
from ie_core.experiments.patchscopes import patchscope, read_patchscopes, selfie, source_states
from ie_core.experiments.probes import probe_scores
from ie_core.experiments.ragged import capture_ragged, capture_ragged_async
from ie_core.experiments.saes import from_tensors
from ie_core.experiments.splice import splice
from ie_core.experiments.user_hooks import (
    attribution_patch,
    attribution_patch_async,
    generate_with_hooks,
    run_with_hooks,
)
from ie_core.harvest import aharvest, harvest
from ie_core.harvest.spec import HarvestOptions, build_spec
from ie_core.ops import Additive, steer_at
from ie_core.protocol import SamplingParams
from ie_core.runner import run
from ie_core.sync import SyncModel
from safetensors.torch import load_file

CLEAN, CORRUPT = "The cat sat on the mat", "A cat sat on the hat"  # 10 tokens each
IDS = [[5, 9, 13, 21, 34]]
METRIC = logit_diff(3, 4)


def _surface() -> set[str]:
    """`module.name` of every public ie_core function whose first parameter is the model."""
    names = set()
    for info in pkgutil.walk_packages(ie_core.__path__, "ie_core."):
        if info.name == "ie_core.sync":  # the mirror itself (`unwrap`), not a call on a model
            continue
        module = importlib.import_module(info.name)
        for name in getattr(module, "__all__", ()):
            fn = getattr(module, name, None)
            if inspect.isfunction(fn) and fn.__module__ == info.name:
                params = list(inspect.signature(fn).parameters)
                if params and params[0] == "model":
                    names.add(f"{info.name.removeprefix('ie_core.')}.{name}")
    return names


def _sae(model: Any) -> Any:
    d = model.d_model
    g = torch.Generator().manual_seed(0)
    w = {"W_enc": torch.randn(d, 32, generator=g) / d**0.5, "b_enc": torch.zeros(32),
         "W_dec": torch.randn(32, d, generator=g) / 4, "b_dec": torch.zeros(d)}  # fmt: skip
    return from_tensors(w, address="resid_post.1", activation="relu")


def _lens(model: Any) -> JacobianLens:
    mats = {1: torch.eye(model.d_model) * 0.5}
    return JacobianLens(model.model_id, model.n_layers, model.d_model, mats, n_rows=1)


def _transcoders(model: Any) -> TranscoderSet:
    n, d = model.n_layers, model.d_model
    return TranscoderSet(tuple(random_transcoder(d, 16, i, seed=i) for i in range(n)))


def _harvest(fn: Callable[..., Any], tmp: Path) -> Callable[[Any], Any]:
    corpus = tmp / "corpus.txt"
    write_corpus(corpus, documents=4)

    def call(m: Any) -> Any:
        out = tmp / f"out-{type(m).__name__}"
        result = fn(m, out, POINTS, files=[corpus], progress=False, **OPTIONS)
        result = run(result) if inspect.iscoroutine(result) else result
        shards = sorted(p.name for p in out.glob("*.safetensors"))
        # Compare the tensors, not the bytes: a shard's header names its own folder.
        return (result.shards, result.tokens, shards, [load_file(out / s) for s in shards])

    return call


def _atlas(sae: Any, tmp: Path) -> Callable[[Any], Any]:
    docs = [f"the river {i} runs over the blue sky quickly" for i in range(6)]

    def call(m: Any) -> Any:
        out = tmp / f"atlas-{type(m).__name__}"
        result = atlas(m, sae, out, documents=docs, context=8, top_k=3, logits=2, progress=False)
        data = open_atlas(out)
        return (result.windows, result.tokens, data.state.top_values, data.state.top_sequence)

    return call


def _calls(model: Any, tmp: Path) -> dict[str, Callable[[Any], Any]]:
    sae, lens = _sae(model), _lens(model)
    rows = capture(model, IDS, ["resid_post.1"])["resid_post.1"][0]
    opts = HarvestOptions.make(model, ("resid_post.1",), ())
    vec = steer_at("resid_post.1", Additive(torch.ones(model.d_model)))
    tcs = _transcoders(model)
    state = prepare(model, CLEAN, tcs)
    two = SamplingParams(max_new_tokens=2, stop_at_eos=False)

    def steered(m: Any) -> Any:
        with steer(m, vec):
            return capture(m, IDS, ["resid_post.2"])["resid_post.2"]

    return {
        "active_steering.steer": steered,
        "active_steering.with_active": lambda m: with_active(m, vec),
        "experiments.analysis.chat_spans": lambda m: chat_spans(
            m, [{"role": "user", "content": "hi"}]
        ),
        "circuits.attribution.attribute": lambda m: attribute(m, CLEAN, tcs, max_n_logits=3),
        "circuits.attribution.prepare": lambda m: prepare(m, CLEAN, tcs, max_n_logits=3),
        "circuits.attribution.prepare_many": lambda m: prepare_many(m, [CLEAN], tcs),
        "circuits.attribution.attribute_many": lambda m: attribute_many(
            m, [CLEAN], tcs, max_n_logits=3
        ),
        "circuits.attribution.graph_of": lambda m: graph_of(m, state, CLEAN),
        "circuits.interventions.intervene": lambda m: intervene(m, CLEAN, tcs, [(1, None, 2, 3.0)]),
        "circuits.weights.weights_for": lambda m: weights_for(m),
        "circuits.qk.qk_weights_for": lambda m: qk_weights_for(m),
        "atlas.running.atlas": _atlas(sae, tmp),
        "api.capture": lambda m: capture(m, IDS, ["resid_post.1", "z.0"]),
        "api.capture_attention": lambda m: capture_attention(m, CLEAN, [0]),
        "api.capture_generation": lambda m: capture_generation(
            m, CLEAN, ["resid_post.1"], max_new_tokens=3
        ),
        "api.decode_residuals": lambda m: decode_residuals(m, rows, k=3),
        "api.generate": lambda m: generate(m, CLEAN, max_new_tokens=3),
        "api.run_with_cache": lambda m: run_with_cache(m, IDS, ["resid_post.1", "z.0"]),
        "experiments.feature_stream.stream_features": lambda m: list(
            stream_features(m, CLEAN, {"s": sae})
        ),
        "experiments.features.check_dictionary": lambda m: check_dictionary(m, sae),
        "experiments.features.feature_activations": lambda m: feature_activations(
            m, CLEAN, sae, k=4
        ),
        "harvest.harvesting.aharvest": _harvest(aharvest, tmp),
        "harvest.harvesting.harvest": _harvest(harvest, tmp),
        "harvest.spec.build_spec": lambda m: build_spec(m, opts, ()),
        "experiments.jacobian_lens.ajacobian_lens_topk": lambda m: run(
            ajacobian_lens_topk(m, lens, rows, 1)
        ),
        "experiments.jacobian_lens.jacobian_lens_topk": lambda m: jacobian_lens_topk(
            m, lens, rows, 1
        ),
        "experiments.lens_stream.lens_transports": lambda m: lens_transports(
            m, ["resid_post.1"], lens
        ),
        "experiments.lens_stream.stream_lens": lambda m: list(
            stream_lens(m, CLEAN, ["resid_post.1"], max_new_tokens=2)
        ),
        "experiments.patching.answer_logprobs": lambda m: run(
            answer_logprobs(m, [IDS[0]], [None], [[7], [3, 4, 5]])
        ),
        "experiments.patching.answer_tokens": lambda m: answer_tokens(m, " Paris"),
        "experiments.patching.decode_rows": lambda m: run(decode_rows(m, rows)),
        "experiments.patching.final_logits": lambda m: run(final_logits(m, [CLEAN], [None])),
        "experiments.patching.mean_activation": lambda m: mean_activation(
            m, [CLEAN], "resid_post.1"
        ),
        "experiments.patching.mean_activation_async": lambda m: run(
            mean_activation_async(m, [CLEAN], "resid_post.1")
        ),
        "experiments.patching.patch_sweep": lambda m: patch_sweep(
            m, CLEAN, CORRUPT, metric=METRIC, layers=[1]
        ),
        "experiments.patching.patch_sweep_async": lambda m: run(
            patch_sweep_async(m, CLEAN, CORRUPT, metric=METRIC, layers=[1])
        ),
        "experiments.patching.prompt_token_ids": lambda m: prompt_token_ids(m, CLEAN),
        "experiments.patching.single_token": lambda m: single_token(m, 7),
        "experiments.patchscopes.patchscope": lambda m: patchscope(m, CLEAN, 1, -1, sampling=two),
        "experiments.patchscopes.read_patchscopes": lambda m: run(
            read_patchscopes(m, CLEAN, -1, [0, 1], sampling=two)
        ),
        "experiments.patchscopes.selfie": lambda m: selfie(m, CLEAN, -1, [1], sampling=two),
        "experiments.patchscopes.source_states": lambda m: run(source_states(m, CLEAN, -1, [0, 1])),
        "experiments.probes.probe_scores": lambda m: probe_scores(
            m, CLEAN, "resid_post.1", torch.ones(m.d_model), activation="tanh"
        ),
        "experiments.ragged.capture_ragged": lambda m: capture_ragged(
            m, [CLEAN, "Hi"], ["resid_post.1"]
        ),
        "experiments.ragged.capture_ragged_async": lambda m: run(
            capture_ragged_async(m, [CLEAN, "Hi"], ["resid_post.1"])
        ),
        "experiments.splice.splice": lambda m: splice(m, [CLEAN], sae),
        "experiments.user_hooks.attribution_patch": lambda m: attribution_patch(
            m, CLEAN, CORRUPT, metric=METRIC, layers=[1]
        ),
        "experiments.user_hooks.attribution_patch_async": lambda m: run(
            attribution_patch_async(m, CLEAN, CORRUPT, metric=METRIC, layers=[1])
        ),
        "experiments.user_hooks.generate_with_hooks": lambda m: generate_with_hooks(
            m, CLEAN, [("resid_post.1", lambda x, _: x * 2)], max_new_tokens=3
        ),
        "experiments.user_hooks.run_with_hooks": lambda m: run_with_hooks(
            m, IDS, [("resid_post.1", lambda x, _: x * 2)], ["resid_post.2"]
        ),
    }


def _outcome(call: Callable[[Any], Any], model: Any) -> tuple[str, Any]:
    try:
        return "ok", call(model)
    except Exception as error:  # the refusal itself is part of what must match
        return "raised", (type(error), str(error))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(
            _same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)
        )
    if isinstance(a, Mapping):
        return isinstance(b, Mapping) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


@pytest.fixture(scope="module")
def model() -> Any:
    return synthetic_model("llama")


def test_every_public_free_function_has_a_row(model: Any, tmp_path: Path) -> None:
    assert set(_calls(model, tmp_path)) == _surface()


@pytest.mark.parametrize("name", sorted(_surface()))
def test_sync_model_and_model_alike(model: Any, tmp_path: Path, name: str) -> None:
    call = _calls(model, tmp_path)[name]
    plain, mirrored = _outcome(call, model), _outcome(call, SyncModel(model))
    assert plain[0] == mirrored[0], (plain, mirrored)
    assert _same(plain[1], mirrored[1]), name
    # Refusing is allowed only where the backend does not serve the call at all.
    refused = {"experiments.analysis.chat_spans"}
    assert plain[0] == "ok" or name in refused, plain


def test_negative_control_a_call_that_does_not_unwrap(model: Any) -> None:
    """A free function written without `unwrap` (handing the mirror's blocking result to the
    runner as if it were a coroutine) fails the comparison above."""

    def naive(m: Any) -> Any:
        return run(m.capture(IDS, ["resid_post.1"]))

    plain, mirrored = _outcome(naive, model), _outcome(naive, SyncModel(model))
    assert plain[0] == "ok" and mirrored[0] == "raised"
