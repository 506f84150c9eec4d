"""Hub ids: eager passes `revision`, `cache_dir`, `token` and `local_files_only` to transformers for
config, weights and tokenizer, and no longer forces `local_files_only=True`.

The Hub itself is not reachable from CI, so a Hugging Face cache is laid out by hand (refs ->
snapshot) from two synthetic families and read with `local_files_only=True`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from ie_core.errors import ModelNotFoundError
from ie_eager import backend
from ie_eager.synthetic import build

REPO = "ie-test/tiny"


def _snapshot(cache: Path, ref: str, commit: str, family: str) -> None:
    repo = cache / f"models--{REPO.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    shutil.copytree(build(family), repo / "snapshots" / commit)


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("hf-cache")
    _snapshot(cache, "main", "a" * 40, "llama")
    _snapshot(cache, "v2", "b" * 40, "gpt2")
    return cache


def test_revision_picks_the_snapshot(hub_cache: Path) -> None:
    common = {"cache_dir": str(hub_cache), "local_files_only": True, "device": "cpu"}
    main = backend.load(REPO, **common)
    other = backend.load(REPO, revision="v2", **common)
    assert main.hf_model.config.model_type == "llama"
    assert other.hf_model.config.model_type == "gpt2"  # negative control: the revision mattered


def test_missing_revision_is_a_clear_error(hub_cache: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="Hugging Face Hub"):
        backend.load(REPO, revision="nope", cache_dir=str(hub_cache), local_files_only=True)


def test_hub_options_reach_all_three_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, object]] = []

    class Stop(Exception):
        pass

    def fake_config(source: str, **kw: object) -> None:
        seen.append(kw)
        raise Stop

    monkeypatch.setattr("transformers.AutoConfig.from_pretrained", fake_config)
    # This machine has no Hub: the reachability probe (tested in test_eager_offline_advice.py)
    # would refuse first, and this test is about the options reaching the loads.
    monkeypatch.setattr("ie_eager.checkpoint.hub_unreachable", lambda *a, **k: None)
    with pytest.raises(Stop):
        backend.load(REPO, revision="r1", token="t0k")
    # Downloads are allowed by default: nothing forces local_files_only.
    assert seen == [{"revision": "r1", "token": "t0k"}]
