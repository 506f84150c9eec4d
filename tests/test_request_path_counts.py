"""scripts/request_path_counts.py on tiny synthetic checkouts: each count sees what was planted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "request_path_counts.py"

KINDS = "from ie_core.ops.patch import Patch\n_ALL = (Patch,)\n"
PLANTED = {
    "packages/ie-core/src/ie_core/__init__.py": "",
    "packages/ie-core/src/ie_core/ops/__init__.py": "",
    "packages/ie-core/src/ie_core/ops/patch.py": "class Patch:\n    pass\n",
    "packages/ie-core/src/ie_core/ops/kinds.py": KINDS,
    # a circle a <-> b at module level; one import inside a function
    "packages/ie-core/src/ie_core/a.py": "from ie_core import b\n\ndef f():\n    import json\n",
    "packages/ie-core/src/ie_core/b.py": (
        "from ie_core.a import f\nfrom ie_core.ops.patch import Patch\n\n"
        "def g(op, backend):\n"
        '    """Not counted: eager."""\n'
        "    if isinstance(op, Patch):\n"
        '        raise ValueError("vllm is not counted in a message")\n'
        '    return backend == "vllm-generate" or backend == "eager"\n'
    ),
    # a circle held apart by an import inside a function, running up from a subpackage
    "packages/ie-vllm/src/ie_vllm/__init__.py": "from ie_vllm.worker import ext\n",
    "packages/ie-vllm/src/ie_vllm/worker/__init__.py": "",
    "packages/ie-vllm/src/ie_vllm/worker/ext.py": (
        'GENERATE = "vllm-generate"\n\ndef h(backend):\n    import ie_vllm\n'
        "    return backend != GENERATE\n"
    ),
}
QUIET = {  # the same shapes with nothing to count
    "packages/ie-core/src/ie_core/__init__.py": "",
    "packages/ie-core/src/ie_core/ops/__init__.py": "",
    "packages/ie-core/src/ie_core/ops/patch.py": "class Patch:\n    pass\n",
    "packages/ie-core/src/ie_core/ops/kinds.py": KINDS,
    "packages/ie-core/src/ie_core/a.py": "import json\n\ndef f(x):\n    return isinstance(x, int)\n",
    "packages/ie-core/src/ie_core/b.py": 'from ie_core import a\n\nNAME = "generate"\n',
}


def counts(root: Path, files: dict[str, str]) -> dict:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    run = [sys.executable, str(SCRIPT), "--root", str(root), "--json"]
    return json.loads(subprocess.run(run, check=True, capture_output=True, text=True).stdout)


def test_each_planted_count_is_seen(tmp_path: Path) -> None:
    result = counts(tmp_path, PLANTED)
    assert result["op_classes"] == ["Patch"]
    core, vllm = result["packages"]["ie-core"], result["packages"]["ie-vllm"]
    assert core == {
        "op_sites": 1,
        "vllm_generate_tests": 1,
        "backend_names": 2,  # "vllm-generate" and "eager" in the comparison
        "circles": 1,
        "hidden": 1,
        "up": 0,
        "function_imports": 1,
    }
    assert result["circles"]["ie-core"] == [["ie_core.a", "ie_core.b"]]
    assert vllm["circles"] == 0 and vllm["hidden"] == 1 and vllm["up"] == 1
    assert vllm["function_imports"] == 1 and vllm["vllm_generate_tests"] == 1
    assert result["total"]["function_imports"] == 2


def test_a_tree_with_none_counts_zero(tmp_path: Path) -> None:
    result = counts(tmp_path, QUIET)
    assert set(result["total"].values()) == {0}


def test_the_table_names_the_circle(tmp_path: Path) -> None:
    counts(tmp_path, PLANTED)
    run = [sys.executable, str(SCRIPT), "--root", str(tmp_path)]
    table = subprocess.run(run, check=True, capture_output=True, text=True).stdout
    assert "circle in ie-core: ie_core.a ie_core.b" in table
    assert "hidden circle in ie-vllm: ie_vllm ie_vllm.worker.ext" in table


def test_an_old_checkout_falls_back_to_op_kinds_and_the_old_homes(tmp_path: Path) -> None:
    result = counts(
        tmp_path,
        {
            "packages/ie-core/src/ie_core/steering.py": (
                'class Additive: ...\nclass Steering: ...\nOP_KINDS = {"additive": Additive}\n'
            ),
            "packages/ie-core/src/ie_core/interventions.py": "class Hook: ...\n",
            "packages/ie-core/src/ie_core/user.py": (
                "from ie_core.steering import Additive, Steering\n\n"
                "def f(x):\n    return isinstance(x, Steering) or isinstance(x, Additive)\n"
            ),
        },
    )
    assert result["op_classes"] == ["Additive", "Hook"]
    assert result["op_source"].startswith("fallback")
    assert result["total"]["op_sites"] == 1
