"""Every shell block of docs/USAGE.md, run or checked as written (the Python blocks run in
tests/test_docs_blocks.py).

Each command line (continuations joined, comments dropped) must start with `uv run --locked`,
the way a fresh clone runs it (`uv sync --locked` builds the environment; this test runs in the
checkout's, with `UV_PROJECT` pointing `uv run` at the repository so commands can run in a
scratch folder), except `curl`.

Run for real, in a scratch folder:
- `ie trace MODEL --transcoders SRC ...`, the block's placeholders filled as its prose says:
  MODEL = ie-synthetic/llama, SRC = a folder of random per-layer transcoders written here;
- `ie dashboard graph capital.json`, into a scratch database (`DATABASE_URL`);
- the `curl` POST, against a dashboard this test serves (its URL for http://127.0.0.1:8000,
  its token in `IE_DASHBOARD_TOKEN`), which must answer 201 with the graph's id.

Checked only, every other line: the command's `--help` parses and names every `--flag` the line
uses. These are the long ones: `ie_evals.lm_eval_cli run` (a model load and lm-eval; the `full`
test packages/ie-evals/tests/test_lm_eval_eager.py::test_the_documented_command_runs_a_local_task
runs it on a local task), `docs/examples/transcoders_smollm2.py` (7 minutes; the `full` test
tests/test_example_writes.py runs a tiny configuration) and the worked example's `ie trace` on
SmolLM2 (it needs the example's transcoders).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
USAGE = ROOT / "docs" / "USAGE.md"
FENCE = re.compile(r"^```(bash|sh|shell|console)\s*$")
COMMENT = re.compile(r"\s+#\s.*$")  # a trailing comment (the blocks hold no '#' otherwise)
UV = ["uv", "run", "--locked"]
NOT_UV = ("curl",)  # tools that are not the project's
REAL = ("uv run --locked ie trace MODEL ", "uv run --locked ie dashboard graph ", "curl ")
TOKEN = "docs-shell-token"


@dataclass(frozen=True)
class Command:
    line: int  # of its first physical line in USAGE.md
    text: str  # continuations joined, comment dropped

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text, comments=True)

    @property
    def real(self) -> bool:
        return self.text.startswith(REAL)


def shell_commands(path: Path = USAGE) -> list[list[Command]]:
    """The commands of each shell block, in order."""
    lines = path.read_text().splitlines()
    blocks: list[list[Command]] = []
    i = 0
    while i < len(lines):
        if not FENCE.match(lines[i]):
            i += 1
            continue
        block: list[Command] = []
        j, start, text = i + 1, None, ""
        while not lines[j].startswith("```"):
            part = lines[j]
            start = j + 1 if start is None else start
            if part.rstrip().endswith("\\"):
                text += part.rstrip()[:-1] + " "
            else:
                text += part
                text = COMMENT.sub("", " ".join(text.split()))
                if text:
                    block.append(Command(start, text))
                start, text = None, ""
            j += 1
        blocks.append(block)
        i = j + 1
    return blocks


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    return {**env, "UV_PROJECT": str(ROOT), **extra}


def _helps(prefixes: list[tuple[str, ...]]) -> dict[tuple[str, ...], str]:
    """Each prefix's `--help` output, the processes run side by side (each is mostly imports)."""
    running = {
        p: subprocess.Popen(
            [*p, "--help"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=_env(),
        )
        for p in dict.fromkeys(prefixes)
    }
    out = {}
    for p, proc in running.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, (p, stderr[-2000:])
        out[p] = stdout
    return out


def test_the_collector_sees_the_shell_blocks() -> None:
    """A guard against passing on nothing: USAGE has three shell blocks, six commands."""
    blocks = shell_commands()
    assert len(blocks) >= 3 and sum(map(len, blocks)) >= 6, blocks
    assert sum(c.real for b in blocks for c in b) == 3


def test_every_command_starts_with_uv_run_locked() -> None:
    wrong = [
        f"USAGE.md:{c.line}: {c.text}"
        for b in shell_commands()
        for c in b
        if c.argv[:3] != UV and c.argv[0] not in NOT_UV
    ]
    assert wrong == [], wrong


def test_the_long_commands_parse_and_their_flags_exist() -> None:
    checked = []
    for block in shell_commands():
        for c in block:
            if c.real or c.argv[0] in NOT_UV:
                continue
            program = c.argv[3:]
            head = next(i for i, a in enumerate(program) if a.startswith("--"))
            flags = [a.split("=")[0] for a in program[head:] if a.startswith("--")]
            checked.append((c, (*UV, *program[:head]), flags))
    helps = _helps([prefix for _, prefix, _ in checked])
    for c, prefix, flags in checked:
        missing = [f for f in flags if not re.search(rf"{re.escape(f)}\b", helps[prefix])]
        assert missing == [], f"USAGE.md:{c.line}: {missing} not in its --help"
    assert len(checked) >= 3


def _transcoders(folder: Path) -> Path:
    from ie_core import load_model
    from ie_core.circuits import random_transcoder, write_layer_file

    model = load_model("ie-synthetic/llama", backend="eager")
    folder.mkdir()
    for layer in range(model.n_layers):
        tc = random_transcoder(model.d_model, 16, layer, seed=layer)
        write_layer_file(tc, folder / f"layer_{layer}.safetensors")
    return folder


def test_the_graph_block_runs_as_written(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient  # noqa: F401  (the dashboard's extra is installed)
    from ie_dashboard.app import create_app
    from ie_dashboard.config import database_url
    from ie_dashboard.db import Database
    from ie_dashboard.serve import background_server

    (block,) = [b for b in shell_commands() if any(c.real for c in b)]
    src = _transcoders(tmp_path / "src")
    served = Database(database_url(tmp_path / "served.sqlite"))
    served.migrate()
    env = _env(DATABASE_URL=database_url(tmp_path / "cli.sqlite"), IE_DASHBOARD_TOKEN=TOKEN)
    with background_server(create_app(served, token=TOKEN)) as base:
        for c in block:
            assert c.real, c
            text = c.text.replace("ie trace MODEL ", "ie trace ie-synthetic/llama ")
            text = text.replace(" SRC ", f" {shlex.quote(str(src))} ")
            text = text.replace("http://127.0.0.1:8000", base)
            if text.startswith("curl") and shutil.which("curl") is None:
                pytest.fail("curl is not installed; the block uses it")
            done = subprocess.run(
                ["bash", "-c", text], capture_output=True, text=True, cwd=tmp_path, env=env,
                timeout=300, check=False,
            )  # fmt: skip
            assert done.returncode == 0, (c.text, done.stdout[-2000:], done.stderr[-2000:])
            if text.startswith("curl"):
                answer = json.loads(done.stdout)
                assert isinstance(answer.get("id"), int), answer
    served.dispose()
    assert json.loads((tmp_path / "capital.json").read_text())["metadata"]["prompt"] == (
        "The capital of France is"
    )
