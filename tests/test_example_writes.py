"""docs/examples/transcoders_smollm2.py writes only under --out, and says what it is doing.

The committed records (docs/img/graph_smollm2.png, docs/notes/transcoders_smollm2.json) used to
be the defaults of --picture / --summary, so `--out OUT` overwrote them; and a run with stderr
not a terminal printed nothing through the harvest (251 s). The fast tests read the script's
argument handling and paths; the `full` one runs the whole script on a tiny configuration (1,024
tokens, 4 Adam steps, 32 features: about a minute here) with stdout and stderr piped, and checks
the committed files' bytes are unchanged and a line came out per stage.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docs" / "examples" / "transcoders_smollm2.py"
COMMITTED = [ROOT / "docs/img/graph_smollm2.png", ROOT / "docs/notes/transcoders_smollm2.json"]


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("transcoders_smollm2", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_path_is_under_out(tmp_path: Path) -> None:
    ex = example()
    args = ex.parse_args(["--out", str(tmp_path / "o")])
    paths = ex.Outputs(args.out, args.update_docs)
    written = [paths.harvest, paths.transcoders, paths.graph, paths.picture, paths.summary]
    assert all(p.is_relative_to(tmp_path / "o") for p in written), written
    assert paths.committed() == []
    # No option left whose default points into the repository.
    for value in vars(args).values():
        if isinstance(value, Path):
            assert not value.resolve().is_relative_to(ROOT), value


def test_update_docs_is_the_explicit_way_to_the_committed_records(tmp_path: Path) -> None:
    ex = example()
    args = ex.parse_args(["--out", str(tmp_path), "--update-docs"])
    pairs = ex.Outputs(args.out, args.update_docs).committed()
    assert [c for _, c in pairs] == COMMITTED
    assert all(w.is_relative_to(tmp_path) for w, _ in pairs)


def test_stage_lines_print_when_stdout_is_not_a_terminal(capsys: pytest.CaptureFixture) -> None:
    ex = example()
    assert not sys.stdout.isatty()
    ex.stage("harvesting")
    out = capsys.readouterr().out
    assert out.endswith("] harvesting\n") and out.startswith("["), out


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.full
@pytest.mark.browser
def test_a_tiny_run_writes_nothing_outside_out(tmp_path: Path) -> None:
    before = {p: _digest(p) for p in COMMITTED}
    env = {k: v for k, v in os.environ.items() if k != "IE_PROGRESS"}
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--tokens", "1024", "--width", "32",
         "--steps", "4"],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert {p: _digest(p) for p in COMMITTED} == before
    assert {p.name for p in out.iterdir()} == {
        "harvest", "transcoders", "graph.json", "graph_smollm2.png", "transcoders_smollm2.json",
    }  # fmt: skip
    stages = [line for line in done.stdout.splitlines() if line.startswith("[")]
    for what in ("loading", "harvesting", "harvested", "training", "attributing", "clamping",
                 "drawing", "wrote"):  # fmt: skip
        assert any(what in line for line in stages), (what, done.stdout)
