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


READS = {  # issue 63's counts, each planted once
    "packages/ie-core/src/ie_core/wire.py": (
        'ROUTES = {"info": Route("GET", "/info"), "capture": Route("POST", "/capture"),\n'
        '          "probe_scores": Route("POST", "/probe_scores")}\n'
    ),
    "packages/ie-core/src/ie_core/plan.py": 'CAPTURE = "capture"\n',
    "packages/ie-core/src/ie_core/reads.py": (
        "def f(model, method):\n"
        '    a = getattr(model, "probe_scores", None)\n'
        "    b = getattr(model, method, None)\n"
        '    c = getattr(model, "info", None)\n'  # not a method of a model class
        "    for name in ('x',):\n        d = getattr(model, name, None)\n"
    ),
    "packages/ie-vllm/src/ie_vllm/host/backend.py": (
        "class VLLMModel:\n    async def probe_scores(self):\n        pass\n"
    ),
    "packages/ie-vllm/src/ie_vllm/server/http_routes.py": (
        "@router.api_route(**mount(CAPTURE))\nasync def capture(request):\n"
        "    m = _model(request)\n    return await _plan(request, CAPTURE)\n\n"
        '@router.api_route(**mount("info"))\nasync def info(request):\n    return _model(request)\n'
    ),
    "packages/ie-vllm/src/ie_vllm/server/http_features.py": (
        '@router.api_route(**mount("probe_scores"))\nasync def probe_scores(request):\n'
        "    return _model(request)\n"
    ),
    "packages/ie-eager/src/ie_eager/hooks.py": (
        'def run(a):\n    if a.kind == "steer":\n        pass\n    return a.kind != "read"\n'
    ),
    "packages/ie-eager/src/ie_eager/actions.py": 'def ok(a):\n    return a.kind == "judge"\n',
}
REPEAT = "x = compute_something_long(a, b)\ny = compute_other_thing(x, c)\nz = x + y * 2\nprint(x, y, z)\n"


def test_each_planted_read_count_is_seen(tmp_path: Path) -> None:
    reads = counts(tmp_path, READS)["reads"]
    assert reads["getattr_probes"] == 2  # the literal backend method and the caller's name
    assert (reads["routes"], reads["model_routes"], reads["plan_routes"]) == (3, 2, 1)
    assert reads["reducer_files"] == 3  # the probe's backend method, route and getattr probe
    assert reads["action_kind_tests"] == 3  # two in hooks.py, one in actions.py


def test_a_reducer_in_its_module_and_registry_is_two_files(tmp_path: Path) -> None:
    files = {
        "packages/ie-core/src/ie_core/reduce/probe.py": (
            'class ProbeScores(Reducer):\n    kind: ClassVar[str] = "probe"\n'
        ),
        "packages/ie-core/src/ie_core/reduce/kinds.py": "_ALL = (TokenLogits, ProbeScores)\n",
        "packages/ie-core/src/ie_core/front.py": "def f():\n    return ProbeScores(1)\n",
    }
    reads = counts(tmp_path, files)["reads"]
    assert reads["reducer_files"] == 2 and reads["getattr_probes"] == 0


def test_duplicates_are_counted_once_per_repeat(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text('"""Doc."""\nimport os\n' + REPEAT + "w = 1\n")
    (tmp_path / "b.py").write_text(
        "def g():\n    pass\n" + REPEAT.replace("print(x, y, z)", "q = 3")
    )
    (tmp_path / "c.py").write_text(REPEAT)
    run = [sys.executable, str(SCRIPT), "duplicates", str(tmp_path)]
    out = subprocess.run(run, check=True, capture_output=True, text=True).stdout
    assert out.splitlines()[-1] == "1 duplicate pairs in 3 files"  # a and c; b differs
    assert "a.py:3" in out and "c.py:1" in out
