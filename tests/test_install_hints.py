"""What a partial install says: a vLLM backend without an engine names both extras; a backend
whose package is missing names the command to type; every package carries the same metadata."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from ie_core import loading
from ie_core.errors import BackendNotInstalledError
from ie_vllm import entry

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = [
    *sorted((ROOT / "packages").iterdir()),
    ROOT / "apps" / "dashboard",
    ROOT / "benchmarks",
    ROOT / "validator",
]


def test_vllm_backend_without_engine_names_both_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(entry.importlib.util, "find_spec", lambda name, *a: None)
    for backend in ("vllm", "vllm-generate", "vllm-static"):
        with pytest.raises(BackendNotInstalledError) as caught:
            loading.load_model("ie-synthetic/llama", backend=backend)
        text = str(caught.value)
        assert "ie-vllm[gpu]" in text and "ie-vllm[cpu]" in text, text
        assert "download.pytorch.org/whl/cpu" in text


def test_missing_backend_package_names_the_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    from ie_core import backend_plugin

    # No backend installed: the descriptors' discovery finds no entry point at all.
    monkeypatch.setattr(backend_plugin, "entry_points", lambda **_: [])
    with pytest.raises(BackendNotInstalledError, match=r"ie-vllm\[gpu\].*ie-vllm\[cpu\]"):
        loading.load_model("x", backend="vllm")
    with pytest.raises(BackendNotInstalledError, match=r"'ie-static' 'ie-vllm\[cpu\]'"):
        loading.load_model("x", backend="vllm-static")


def _project(folder: Path) -> dict:
    return tomllib.loads((folder / "pyproject.toml").read_text())["project"]


@pytest.mark.parametrize("folder", PACKAGE_DIRS, ids=lambda p: p.name)
def test_package_metadata_is_complete_and_in_lockstep(folder: Path) -> None:
    project = _project(folder)
    root_version = _project(ROOT / "packages" / "ie-core")["version"]
    assert project["version"] == root_version
    assert (folder / project["readme"]).is_file()
    assert project["license"] == "Apache-2.0"
    assert (folder / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
    # The repository declares no public URL anywhere, so the packages invent none.
    assert "urls" not in project
    assert "Typing :: Typed" in project["classifiers"]
    module = next((folder / "src").glob("ie_*"))
    assert (module / "py.typed").is_file()
    # Internal dependencies are pinned to the same release.
    extras = project.get("optional-dependencies", {}).values()
    for requirement in [*project["dependencies"], *(r for group in extras for r in group)]:
        name = requirement.split("[")[0].split("=")[0].split(">")[0].strip()
        if name.startswith("ie-"):
            assert requirement.endswith(f"=={root_version}"), requirement
