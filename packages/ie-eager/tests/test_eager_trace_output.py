"""What `ie trace` tells its user (issue 68, item 2): the thresholds that bring a graph under the
dashboard graph page's limits, and the token ids it attributed, following circuit-tracer's
convention for a text prompt.

The limit test lowers `ie_core.graph_limits.MAX_GRAPH_LINKS` (the page's real limit, 50,000
edges, needs a graph of minutes on 2 cores) so a synthetic graph is over it, then reruns the
command with the thresholds it named and counts the links in the file it writes. The token test
computes circuit-tracer 0.5.0's ids by its rule (`ensure_tokenized`: the text without special
tokens; one special token first, the tokenizer's BOS, unless the text starts with one) from the
Hugging Face tokenizer directly, on SmolLM2, whose tokenizer adds no BOS of its own.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from eager_support import synthetic_model
from ie_core import graph_limits
from ie_core.circuits import random_transcoder, write_layer_file
from ie_core.circuits.command import trace_command


def _folder(model, tmp_path: Path, width: int = 16) -> Path:  # type: ignore[no-untyped-def]
    folder = tmp_path / "tc"
    folder.mkdir()
    for layer in range(model.n_layers):
        tc = random_transcoder(model.d_model, width, layer, seed=layer)
        write_layer_file(tc, folder / f"layer_{layer}.safetensors")
    return folder


def test_a_graph_over_the_page_limit_names_thresholds_that_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = synthetic_model("llama")
    argv = ["ie-synthetic/llama", "--backend", "eager", "--transcoders", str(_folder(m, tmp_path))]
    argv += ["--prompt", "The capital of France is"]
    assert trace_command([*argv, "--out", str(tmp_path / "all.json")]) == 0
    links = len(json.loads((tmp_path / "all.json").read_text())["links"])
    assert links > 40, links  # enough for a limit well under it to mean something
    capsys.readouterr()

    limit = links // 4
    monkeypatch.setattr(graph_limits, "MAX_GRAPH_LINKS", limit)
    assert trace_command([*argv, "--out", str(tmp_path / "big.json")]) == 0
    said = capsys.readouterr().out
    assert f"{links:,} edges (at most {limit:,})" in said, said
    found = re.search(r"--node-threshold (\S+) --edge-threshold (\S+) keeps (\S+) nodes and "
                      r"(\S+) edges", said)  # fmt: skip
    assert found, said
    node, edge = found.group(1), found.group(2)
    assert trace_command([*argv, "--out", str(tmp_path / "fit.json"), "--node-threshold", node,
                          "--edge-threshold", edge]) == 0  # fmt: skip
    fit = json.loads((tmp_path / "fit.json").read_text())
    assert len(fit["links"]) <= limit and len(fit["links"]) == int(found.group(4).replace(",", ""))
    assert "over what the dashboard" not in capsys.readouterr().out  # the rerun fits: no hint


def test_a_text_prompt_is_attributed_as_circuit_tracer_tokenizes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from ie_core import load_model

    m = load_model("HuggingFaceTB/SmolLM2-135M-Instruct", backend="eager")
    text = "The capital of France is"
    tok = m.tokenizer  # pyright: ignore[reportAttributeAccessIssue]  (eager keeps its HF one)
    plain = tok(text, add_special_tokens=False)["input_ids"]
    first = next(t for t in (tok.bos_token_id, tok.pad_token_id, tok.eos_token_id) if t)
    want = plain if plain[0] in tok.all_special_ids else [first, *plain]
    assert want != m.to_tokens(text)  # SmolLM2 adds no BOS itself: the convention matters here

    argv = ["HuggingFaceTB/SmolLM2-135M-Instruct", "--backend", "eager", "--transcoders",
            str(_folder(m, tmp_path, width=8)), "--prompt", text, "--max-feature-nodes", "8"]  # fmt: skip
    assert trace_command([*argv, "--out", str(tmp_path / "ct.json")]) == 0
    said = capsys.readouterr().out
    assert f"as ids {want}" in said, said
    meta = json.loads((tmp_path / "ct.json").read_text())["metadata"]
    assert meta["prompt_tokens"] == [tok.decode([t]) for t in want]
    # --no-bos: the tokenizer's own encoding, the ids said too (negative control).
    assert trace_command([*argv, "--out", str(tmp_path / "own.json"), "--no-bos"]) == 0
    assert f"as ids {m.to_tokens(text)}" in capsys.readouterr().out


def test_the_bisection_finds_the_first_pair_that_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against a plain scan of every candidate, at three limits (the first one fits, a middle
    one, none)."""
    from ie_core.circuits import attribute
    from ie_core.circuits.fitting import _try, candidates, fitting_thresholds

    m = synthetic_model("llama")
    graph = attribute(m, "The capital of France is", _folder(m, tmp_path))
    pairs = list(candidates(0.8, 0.98))
    for limit in (10_000, 60, 1):
        monkeypatch.setattr(graph_limits, "MAX_GRAPH_LINKS", limit)
        scan = next((f for f in (_try(graph, *p) for p in pairs) if f is not None), None)
        assert fitting_thresholds(graph, 0.8, 0.98) == scan, limit
    monkeypatch.setattr(graph_limits, "MAX_GRAPH_LINKS", 60)
    assert fitting_thresholds(graph, 0.8, 0.98) not in (None, _try(graph, *pairs[0]))
