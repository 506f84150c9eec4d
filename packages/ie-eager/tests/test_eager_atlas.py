"""`ie atlas` on eager SmolLM2 (fp32 CPU) against a brute force (plain HF forward, encode,
torch.topk over every token; eager_atlas_support.py) at 1e-5, for a SAELens SAE and a
circuit-tracer transcoder; kill and resume, two shards merged, and hostile input refused before
the model loads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from eager_atlas_support import (
    SMOLLM2,
    brute_force,
    encode,
    reference_rows,
    reference_windows,
    write_circuit_tracer,
    write_saelens,
)
from eager_harvest_support import write_corpus
from ie_core.atlas.command import atlas_command
from ie_core.atlas.dictionary import read_dictionary
from ie_core.atlas.merging import merge_atlases
from ie_core.atlas.reader import open_atlas
from ie_core.atlas.running import atlas
from ie_core.atlas.storage import STATE

WITHIN = 1e-5  # relative to max(1, |value|), as the harvest tests compare rows


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return bool(((got - want).abs() <= WITHIN * want.abs().clamp_min(1.0)).all())


CONTEXT, K = 24, 6
OPTIONS = {"context": CONTEXT, "bos": "window", "top_k": K, "samples": 2, "logits": 5,
           "batch_windows": 4, "checkpoint_windows": 4}  # fmt: skip


@pytest.fixture(scope="module")
def model() -> Any:
    from ie_core import load_model

    return load_model(SMOLLM2, backend="eager", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def hf() -> Any:
    from ie_core.models import resolve_model_path
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = resolve_model_path(SMOLLM2)
    assert folder is not None
    return (
        AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval(),
        AutoTokenizer.from_pretrained(folder),
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    return path, write_corpus(path, documents=30, seed=3)


def _check_against_brute_force(out: Path, want: dict[str, Any], acts: torch.Tensor) -> None:
    got = open_atlas(out)
    s = got.state
    assert s.tokens == acts.shape[0]
    assert torch.equal(s.count, want["count"])
    fired = want["values"] > 0  # a feature firing fewer than K times fills fewer slots
    assert torch.equal(s.top_sequence >= 0, fired)
    assert _close(s.top_values[fired], want["values"][fired])
    row_of = {
        (int(q), int(p)): i for i, (q, p) in enumerate(zip(want["seq"], want["pos"], strict=True))
    }
    for f in range(s.d_sae):  # same top-k sets: (window, position) of each kept value
        n = int(fired[f].sum())
        keys = set(zip(s.top_sequence[f, :n].tolist(), s.top_position[f, :n].tolist(), strict=True))
        ref = set(
            zip(want["sequence"][f, :n].tolist(), want["position"][f, :n].tolist(), strict=True)
        )
        # Where two values lie within fp32 noise at the k-th place, either may be kept: every
        # kept key's brute-force value reaches the k-th (within tolerance), and every clearly
        # larger one is kept.
        kth = float(want["values"][f, n - 1])
        slack = WITHIN * max(1.0, abs(kth))
        assert all(float(acts[row_of[key], f]) >= kth - slack for key in keys), f"feature {f}"
        clear = {key for key in ref if float(acts[row_of[key], f]) > kth + slack}
        assert clear <= keys and len(keys) == len(ref), f"feature {f}"
    _check_histogram(s, acts)
    # Each top context's per-token activations equal the brute force's rows of that window.
    for f in (0, s.d_sae // 2, s.d_sae - 1):
        for j in range(int(fired[f].sum())):
            rows = want["seq"] == s.top_sequence[f, j]
            n = int(rows.sum())
            assert _close(got.contexts["top_acts"][f, j, :n], acts[rows, f])
    assert got.manifest.info["recompute_max_abs_diff"] < WITHIN * float(s.top_values.max())


def _check_histogram(s: Any, acts: torch.Tensor) -> None:
    """Log2 bins counted here from the brute force's values; a value within the tolerance of a
    bin edge may fall on either side of it."""
    b = s.binning
    fired = acts > 0
    octaves = torch.log2(acts.double().clamp_min(1e-30)) * b.per_octave
    inner = (octaves - b.low * b.per_octave).floor().long() + 1
    bins = torch.where(octaves < b.low * b.per_octave, 0, inner.clamp(max=b.bins - 1))
    want = torch.zeros_like(s.histogram)
    for f in range(acts.shape[1]):
        want[f] = torch.bincount(bins[fired[:, f], f], minlength=b.bins)
    near_edge = ((octaves - octaves.round()).abs() < WITHIN * b.per_octave / 0.69) & fired
    moved = (s.histogram - want).abs().sum(1)
    assert (moved <= 2 * near_edge.sum(0)).all()
    assert torch.equal(s.histogram.sum(1), s.count)


def _dictionary_case(kind: str, root: Path) -> tuple[Path, tuple[str, int], Any]:
    if kind == "saelens":
        folder = write_saelens(root / "sae", layer=3, d_sae=48, seed=1)
        from safetensors.torch import load_file

        w = load_file(str(folder / "sae_weights.safetensors"))
        return folder, ("resid_post", 3), lambda rows: encode(rows, w, None)
    path = write_circuit_tracer(root / "tc", layer=2, d_tc=40, seed=2)
    from safetensors.torch import load_file

    raw = load_file(str(path))
    w = {"W_enc": raw["W_enc"].T, "b_enc": raw["b_enc"]}
    return path, ("mlp_in", 2), lambda rows: encode(rows, w, raw["activation_function.threshold"])


@pytest.mark.parametrize("kind", ["saelens", "circuit-tracer"])
def test_atlas_equals_brute_force(
    model: Any, hf: Any, data: Any, tmp_path: Path, kind: str
) -> None:
    source, where, encoder = _dictionary_case(kind, tmp_path)
    sae = read_dictionary(source)
    out = tmp_path / "atlas"
    atlas(model, sae, out, files=[data[0]], dictionary_source=source, progress=False, **OPTIONS)
    windows = reference_windows(hf[1], data[1], CONTEXT)
    acts = encoder(reference_rows(hf[0], windows, where))
    assert 0.02 < float((acts > 0).float().mean()) < 0.9  # a sparse, non-degenerate dictionary
    _check_against_brute_force(out, brute_force(acts, windows, K), acts)
    # Logits: the decoder rows through the unembed, top and bottom 5.
    got = open_atlas(out)
    logits = sae.weights["W_dec"].float() @ hf[0].lm_head.weight.float().T
    assert torch.equal(got.logits["top_ids"], torch.topk(logits, 5, dim=1).indices)
    assert (
        got.logits["bottom_values"] - torch.topk(logits, 5, dim=1, largest=False).values
    ).abs().max() < WITHIN
    if kind == "saelens":
        _check_neuronpedia_export(out, tmp_path, hf[1], acts, windows, logits)
    page = got.feature(0)
    assert page["max"] == float(got.state.top_values[0, 0])
    assert page["top"][0]["acts"][page["top"][0]["position"]] == pytest.approx(
        page["max"], abs=WITHIN
    )


def _check_neuronpedia_export(
    out: Path, tmp: Path, tokenizer: Any, acts: torch.Tensor, windows: list[list[int]],
    logits: torch.Tensor,
) -> None:  # fmt: skip
    """`ie atlas neuronpedia`: each feature's JSON against the brute force's numbers."""
    import json

    assert atlas_command(["neuronpedia", str(out), "--out", str(tmp / "np.jsonl")]) == 0
    features = [json.loads(line) for line in (tmp / "np.jsonl").read_text().splitlines()]
    assert [f["index"] for f in features] == [str(i) for i in range(acts.shape[1])]
    offsets = [sum(len(w) for w in windows[:i]) for i in range(len(windows))]
    for f in (0, 7, acts.shape[1] - 1):
        feature = features[f]
        assert feature["frac_nonzero"] == pytest.approx(float((acts[:, f] > 0).float().mean()))
        assert feature["pos_str"] == [
            tokenizer.decode([t]) for t in torch.topk(logits[f], 5).indices
        ]
        assert sum(feature["freq_hist_data_bar_heights"]) == int((acts[:, f] > 0).sum())
        top = feature["activations"][0]
        assert top["maxValue"] == pytest.approx(float(acts[:, f].max()), rel=WITHIN)
        (window,) = [
            i for i, w in enumerate(windows) if [tokenizer.decode([t]) for t in w] == top["tokens"]
        ]
        want = acts[offsets[window] : offsets[window] + len(windows[window]), f]
        assert _close(torch.tensor(top["values"]), want)
        assert int(want.argmax()) == top["maxValueTokenIndex"]


def test_negative_control_dropping_the_last_step_fails(
    model: Any, hf: Any, data: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass that drops the last batch's reduced rows does not equal the brute force."""
    import ie_core.atlas.running as running

    source, where, encoder = _dictionary_case("saelens", tmp_path)
    sae = read_dictionary(source)
    windows = reference_windows(hf[1], data[1], CONTEXT)
    last = (len(windows) - 1) // OPTIONS["batch_windows"] * OPTIONS["batch_windows"]
    real = running._batch_state

    def dropping(model: Any, sae: Any, batch: list, state: Any) -> Any:
        return state if batch[0][0] >= last else real(model, sae, batch, state)

    monkeypatch.setattr(running, "_batch_state", dropping)
    out = tmp_path / "atlas"
    atlas(model, sae, out, files=[data[0]], progress=False, **OPTIONS)
    acts = encoder(reference_rows(hf[0], windows, where))
    with pytest.raises(AssertionError):
        _check_against_brute_force(out, brute_force(acts, windows, K), acts)


def test_interrupted_run_resumes_to_the_uninterrupted_state(
    model: Any, data: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ie_core.atlas.running as running

    sae = read_dictionary(write_saelens(tmp_path / "sae", layer=3, d_sae=48, seed=1))
    whole = tmp_path / "whole"
    atlas(model, sae, whole, files=[data[0]], progress=False, **OPTIONS)
    real, calls = running._batch_state, []

    def dies(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:  # after two batches of 4 windows, each checkpointed
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(running, "_batch_state", dies)
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        atlas(model, sae, out, files=[data[0]], progress=False, **OPTIONS)
    assert (out / STATE).exists() and not open_atlas_complete(out)
    monkeypatch.setattr(running, "_batch_state", real)
    result = atlas(model, sae, out, files=[data[0]], progress=False, **OPTIONS)
    assert result.resumed_windows == 8
    a, b = open_atlas(whole), open_atlas(out)
    assert a.state.equal(b.state) and torch.equal(a.state.total, b.state.total)
    assert torch.equal(a.contexts["top_acts"], b.contexts["top_acts"])


def open_atlas_complete(folder: Path) -> bool:
    from ie_core.atlas.storage import read_manifest

    found = read_manifest(folder)
    return bool(found and found.complete)


def test_two_shards_merged_equal_one_run(model: Any, data: Any, tmp_path: Path) -> None:
    sae = read_dictionary(write_saelens(tmp_path / "sae", layer=3, d_sae=48, seed=1))
    # One window per forward: each window's rows are then the same in every run, so equality
    # is bit for bit (a batch of another shape may round sums differently).
    opts = {**OPTIONS, "batch_windows": 1}
    one = tmp_path / "one"
    atlas(model, sae, one, files=[data[0]], progress=False, **opts)
    for i in (0, 1):
        atlas(model, sae, tmp_path / f"s{i}", files=[data[0]], shard=(i, 2), progress=False, **opts)
    merged = merge_atlases(tmp_path / "s0", tmp_path / "s1", tmp_path / "merged")
    a, b = open_atlas(one), open_atlas(merged)
    assert a.state.equal(b.state)
    assert torch.allclose(a.state.total, b.state.total, rtol=1e-12, atol=0)
    for name in ("top_acts", "sample_acts"):
        assert torch.equal(a.contexts[name], b.contexts[name])
    assert a.feature(5) == b.feature(5)
    # Negative control: one shard alone is not the whole run.
    assert not open_atlas(tmp_path / "s0").state.equal(a.state)


def _cli(tmp_path: Path, corpus: Path, dictionary: Path, out: Path, *extra: str) -> list[str]:
    return [SMOLLM2, "--backend", "eager", "--dictionary", str(dictionary), "--corpus",
            str(corpus), "--context", str(CONTEXT), "--top-k", str(K), "--out", str(out), *extra]  # fmt: skip


def _refused_before_load(args: list[str], match: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import ie_core.loading

    def no_load(*_: Any, **__: Any) -> Any:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(ie_core.loading, "load_model", no_load)
    with pytest.raises(Exception, match=match) as caught:
        atlas_command(args)
    assert not isinstance(caught.value, AssertionError)


def test_hostile_input_is_refused_before_the_model_loads(
    data: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = write_saelens(tmp_path / "good", layer=3, d_sae=16, seed=1)
    out = tmp_path / "out"
    wide = write_saelens(tmp_path / "wide", layer=3, d_sae=16, seed=1, d_in=512)
    _refused_before_load(
        _cli(tmp_path, data[0], wide, out), "512-wide rows .* 576 wide", monkeypatch
    )
    deep = write_saelens(tmp_path / "deep", layer=40, d_sae=16, seed=1)
    _refused_before_load(_cli(tmp_path, data[0], deep, out), "30 layers", monkeypatch)
    nan = write_saelens(tmp_path / "nan", layer=3, d_sae=16, seed=1)
    from safetensors.torch import load_file, save_file

    w = load_file(str(nan / "sae_weights.safetensors"))
    w["W_dec"][3, 7] = float("nan")
    save_file(w, str(nan / "sae_weights.safetensors"))
    _refused_before_load(_cli(tmp_path, data[0], nan, out), "W_dec holds 1 NaN", monkeypatch)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n")
    _refused_before_load(_cli(tmp_path, empty, good, out), "holds no text", monkeypatch)
    short = tmp_path / "short.txt"
    short.write_text("the cat runs\n")
    _refused_before_load(_cli(tmp_path, short, good, out), "fewer than one window", monkeypatch)
    harvested = tmp_path / "harvest"
    harvested.mkdir()
    (harvested / "manifest.json").write_text("{}")
    _refused_before_load(_cli(tmp_path, data[0], good, harvested), "holds a harvest", monkeypatch)
    # Nothing a later run would trust was written.
    assert not out.exists() or not any(out.iterdir())
    assert sorted(p.name for p in harvested.iterdir()) == ["manifest.json"]


def test_cli_killed_then_rerun_equals_an_uninterrupted_run(
    model: Any, data: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ie atlas` SIGKILLed after its first checkpoint, rerun to the end: equal to one
    uninterrupted library run; then the same folder with another --top-k is refused before the
    model loads, naming the field."""
    dictionary = write_saelens(tmp_path / "sae", layer=3, d_sae=48, seed=1)
    out = tmp_path / "cli"
    args = _cli(tmp_path, data[0], dictionary, out, "--dtype", "float32", "--batch-windows", "2",
                "--checkpoint-windows", "2", "--samples", "2", "--logits", "5")  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, "-m", "ie_core.tooling.cli", "atlas", *args], env=env)
    began = time.monotonic()
    while not (out / STATE).exists() and child.poll() is None and time.monotonic() - began < 300:
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL and not open_atlas_complete(out)
    done = subprocess.run([sys.executable, "-m", "ie_core.tooling.cli", "atlas", *args], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "windows were already there" in done.stdout and "(0 windows" not in done.stdout
    ref = tmp_path / "ref"
    sae = read_dictionary(dictionary)
    atlas(model, sae, ref, files=[data[0]], progress=False,
          **{**OPTIONS, "batch_windows": 2, "checkpoint_windows": 2})  # fmt: skip
    assert open_atlas(out).state.equal(open_atlas(ref).state)
    _refused_before_load(
        _swap(args, "--top-k", "3"), "top_k: folder has 6, this command 3", monkeypatch
    )


def _swap(args: list[str], flag: str, value: str) -> list[str]:
    i = args.index(flag)
    return [*args[: i + 1], value, *args[i + 2 :]]
