"""The committed mutation report (docs/notes/mutation.md) from mutmut's results: killed /
survived per module, the score, and every mutant not killed with its diff and category.

Categories of a mutant not killed: `message` (it changes only the words of an error message or
the label a message names, where no test pins the sentence), `device` (it drops a `device=`
argument: the CPU suite cannot tell devices apart), `default dtype`, `equivalent` (same result for
every input, reason in EQUIVALENT), else `open` (a test should kill it). Usage:
mutation_report.py PACKAGE_DIR... (each with mutants/results.txt and mutants/seconds.txt)
"""

from __future__ import annotations

import ast
import difflib
import re
import sys
from collections import Counter
from pathlib import Path

# Mutants that compute the same thing for every input (name -> why).
EQUIVALENT: dict[str, str] = {
    "ie_core.ragged.x__pad__mutmut_12": "slice(None, n) is slice(0, n)",
    "ie_core.ragged.x__pad__mutmut_14": "slice(n) is slice(0, n)",
    "ie_core.ragged.x_capture_ragged_async__mutmut_36": "the placeholder is overwritten",
    "ie_core.ragged.x_capture_ragged_async__mutmut_39": "order and caches always match in length",
    "ie_core.ragged.x_capture_ragged_async__mutmut_42": "order and caches always match in length",
    "ie_core.ragged.x_capture_ragged_async__mutmut_43": "order and caches always match in length",
    "ie_core.sae_math.x_activate__mutmut_23": "torch.topk's default dim is -1",
    "ie_core.sae_math.x_topk_features__mutmut_7": "torch.topk's default dim is -1",
    "ie_core.sae_math.x_normalized__mutmut_18": "std is shift-invariant: std(x + mu) = std(x - mu)",
    "ie_core.sae_math.xǁDictMetaǁfrom_dict__mutmut_22": "bool(None) is bool(False)",
    "ie_core.sae_math.xǁDictMetaǁfrom_dict__mutmut_24": "bool(None) is bool(False)",
    "ie_core.steer_math.x_unit_vector__mutmut_12": "peak is never 0: as_vector refuses zero vectors",
    "ie_core.steer_math.x_head_columns__mutmut_1": "Patch and Scale refuse heads without head_dim",
    "ie_core.spec_values.x__real_dtype__mutmut_7": "str(None) names no complex or bool dtype",
    "ie_core.spec_values.x__real_dtype__mutmut_10": "str(None) names no complex or bool dtype",
    "ie_core.spec_values.x__real_dtype__mutmut_13": "'' and 'XXXX' name no complex or bool dtype",
    **{
        f"ie_core.spec_values.x_as_row__mutmut_{n}": "a tensor's tolist() is its detach().tolist()"
        for n in (37, 41, 42)
    },
    **{
        f"ie_core.steer_math.x_check_ops_fit__mutmut_{n}": "typing.cast ignores its type at run time"
        for n in (9, 13, 14)
    },
    "ie_core.wire.x_sampling_to_wire__mutmut_9": "asdict always holds the key: pop never misses",
    "ie_vllm.worker.layout.x_record_layout__mutmut_6": "only entries up to num_reqs are read",
    **{
        f"ie_static.ops.x_{f}__mutmut_{n}": "the tap's rows are [n, D] and its masks [n]: dim +1 is dim -1"
        for f, ns in (("_patch_rows", (6, 14, 17)), ("steer_rows", (53, 73, 94, 110, 115, 126)))
        for n in ns
    },
    **{
        f"ie_static.ops.x_steer_rows__mutmut_{n}": "positions lie in [0, P), P = max_model_len"
        for n in (12, 13, 15, 17)
    },
    "ie_vllm.worker.layout.x_record_layout__mutmut_38": "query_start_loc[0] is 0: no requests, 0 tokens",
    "ie_static.taps.x__tapped_forward__mutmut_3": "typing.cast ignores its type at run time",
    # ie-eager's resolver: a Resolved kind other than sum / branch / attention is read as a plain
    # tap everywhere (hooks, admission; the Jacobian lens checks resid_post's kind only), a tap's
    # io is only ever compared with "in", and its path appears only in the message for a module
    # that produced no tensor. These trunk modules carry no other tap.
    **{
        f"ie_eager.resolve.xǁResolverǁ_{f}__mutmut_{n}": "a kind other than sum, branch or "
        "attention is a plain tap"
        for f, ns in (
            ("embeddings", (3, 12, 13)),
            ("final_norm", (10, 19, 20)),
            ("lm_head", (3, 12, 13)),
            ("path", (7, 15, 16)),
        )
        for n in ns
    },
    **{
        f"ie_eager.resolve.xǁResolverǁ_{f}__mutmut_{n}": "a tap's io is only compared with 'in'"
        for f, ns in (
            ("embeddings", (16, 19, 20, 21)),
            ("final_norm", (23, 26, 27, 28)),
            ("lm_head", (16, 19, 20, 21)),
            ("path", (19, 22, 23, 24)),
            ("attention", (21, 24, 25, 26)),
        )
        for n in ns
    },
    **{
        f"ie_eager.resolve.xǁResolverǁ_{f}__mutmut_{n}": "a tap's path is read only by the "
        "message for a module that produced no tensor"
        for f, n in (("embeddings", 14), ("final_norm", 21), ("lm_head", 14), ("path", 17))
    },
    # A path address is never written (a steering spec names registry points only), and a
    # Resolved's writable is read only as a truth value (`not r.writable`, `all(writes)`).
    **{
        f"ie_eager.resolve.xǁResolverǁ_path__mutmut_{n}": "a path address is never written: "
        "steering specs name registry points only"
        for n in (9, 25)
    },
    **{
        name: "writable is read only as a truth value: None is False"
        for name in (
            "ie_eager.resolve.xǁResolverǁ_lm_head__mutmut_6",
            "ie_eager.resolve.xǁResolverǁ_attention__mutmut_11",
        )
    },
    **{
        f"ie_eager.resolve.xǁResolverǁ_{f}__mutmut_{n}": "a kind other than sum, branch or "
        "attention is a plain tap"
        for f, ns in (
            ("mla_value", (12, 21, 22)),
            ("multi_stream", (30, 39, 40, 61, 70, 71, 127, 136, 137)),
            ("gate", (35, 44, 45)),
        )
        for n in ns
    },
    "ie_eager.resolve.xǁResolverǁ_multi_stream__mutmut_138": "a tap's path is read only by the "
    "message for a module that produced no tensor",
    **{
        f"ie_eager.resolve.xǁResolverǁ_multi_stream__mutmut_{n}": "io is only compared with "
        "'in'; as a site of its own at the block output its hooks still run writes first (writes "
        "are installed first, in the order one site would sort them)"
        for n in (73, 76, 77, 122, 123)
    },
    **{
        f"ie_eager.resolve.xǁResolverǁ_gate__mutmut_{n}": "q_proj's per-head group is 2 x "
        "head_dim wide: a slice to None or past the end stops there"
        for n in (25, 32)
    },
    **{
        f"ie_eager.resolve.xǁResolverǁ_{f}__mutmut_{n}": "a tap's io is only compared with 'in' "
        "(and no other tap shares the module's output site)"
        for f, ns in (
            ("mla_value", (25, 29, 31, 32)),
            ("multi_stream", (43, 47, 49, 50)),
            ("mlp_branch", (7, 10, 11, 12, 15, 18, 19, 20)),
            ("gate", (48, 52, 54, 55)),
            ("qk_norm", (36, 37)),
        )
        for n in ns
    },
    **{
        f"ie_eager.resolve.xǁResolverǁ_{f}__mutmut_{n}": "writable is read only as a truth value: "
        "None is False"
        for f, n in (("mla_value", 15), ("multi_stream", 33), ("gate", 38))
    },
    **{
        f"ie_eager.resolve.xǁResolverǁ_{f}__mutmut_{n}": "a kind other than sum, branch or "
        "attention is a plain tap"
        for f, ns in (
            ("mlp_inner", (65, 110, 142, 174)),
            ("qk_norm", (47,)),
            ("router", (74,)),
            ("value", (15,)),
            ("z", (37,)),
        )
        for n in ns
    },
    **{
        f"ie_eager.resolve.xǁResolverǁ_{f}__mutmut_{n}": "a tap's io is only compared with 'in' "
        "(tap_on's default is 'out'; the layout probe reads the same output)"
        for f, ns in (
            ("mlp_inner", (123, 127, 155, 158, 187, 190)),
            ("router", (55, 58, 87, 91)),
            ("value", (28, 31)),
        )
        for n in ns
    },
    "ie_eager.resolve.xǁResolverǁ_mlp_inner__mutmut_108": "gate_up_proj is 2 x d_mlp wide: a "
    "slice to 3 x d_mlp stops at its end, in get and put alike",
    "ie_eager.resolve.xǁResolverǁ_mla_value__mutmut_6": "kv_b_proj's per-head group is "
    "nope + v_dim wide, so the slice to None ends at nope + v_dim",
    **{
        f"ie_eager.resolve.xǁResolverǁ_router_order__mutmut_{n}": "the order memo is per "
        "resolver (one model), whose routers are all one class: any fixed key is one entry"
        for n in (8, 9)
    },
    "ie_eager.resolve.xǁResolverǁ_router_order__mutmut_11": "flipped = None is falsy like False",
    **{
        f"ie_eager.resolve.xǁResolverǁ_router_order__mutmut_{n}": "a router's output items are "
        "2-D [tokens, experts or k]: axis 1 is the last, and the probe's token count leaves it"
        for n in (23, 24)
    },
    "ie_eager.resolve.xǁResolverǁpoint_names__mutmut_11": "a hyper-connection trunk has at least "
    "2 streams (DeepSeek-V4: 4), so stream 1 resolves wherever stream 0 does",
    "ie_eager.resolve.xǁResolverǁ_mlp_branch__mutmut_21": "_mlp_branch runs only on blocks "
    "with both MLPs: neither tap is ever None",
    **{
        f"ie_eager.resolve.xǁResolverǁ_single_stream__mutmut_{n}": "never called: _resolve "
        "refuses multi-stream points on a single trunk and _multi_stream serves them on a "
        "multi-stream one"
        for n in range(1, 7)
    },
    **{
        f"ie_eager.hooks.xǁSessionǁ_rows__mutmut_{n}": "torch.tensor of Python bools is torch.bool"
        for n in (16, 19)
    },
    "ie_eager.hooks.xǁSessionǁ_write__mutmut_75": "steered already has raw's dtype (apply_ops, "
    "the selectors and the scale keep it), so .to(None) and .to(raw.dtype) are both no-ops",
    **{
        f"ie_static.tables.xǁWriteTableǁ_fill_affine__mutmut_{n}": "a Patch has one row or one per "
        "position, and one row broadcasts on assignment to the rows either way"
        for n in (46, 47, 48)
    },
    **{
        f"ie_core.wire.x_steering_from_wire__mutmut_{n}": "bool(None) is bool(False)"
        for n in (77, 79, 85, 87, 93, 95)
    },
}

_LINE = re.compile(r"^\s*(?P<name>\S+__mutmut_\d+): (?P<status>.+)$")
_STRING = re.compile(r'f?"[^"]*"')


def _module_name(name: str) -> str:
    """`ie_core.steer_math.x_op_delta__mutmut_3` -> `ie_core.steer_math` (methods: `xǁClassǁ`)."""
    return ".".join(p for p in name.split(".") if not p.startswith(("x_", "xǁ")))


def _sources(mutants: Path, module: str) -> dict[str, str]:
    path = mutants / "src" / (module.replace(".", "/") + ".py")
    src = path.read_text()
    lines = src.splitlines()  # sliced by line numbers: get_source_segment is quadratic here
    return {
        n.name: "\n".join(lines[n.lineno - 1 : n.end_lineno]).strip()
        for n in ast.walk(ast.parse(src))
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def diff(sources: dict[str, str], name: str) -> list[str]:
    func = name.split(".")[-1]
    base = func.rsplit("__mutmut_", 1)[0]
    orig = sources.get(base + "__mutmut_orig", "").replace(base + "__mutmut_orig", base, 1)
    mutated = sources.get(func, "").replace(func, base, 1)
    orig, mutated = orig.splitlines(), mutated.splitlines()
    lines = difflib.unified_diff(orig, mutated, lineterm="", n=0)
    return [x for x in lines if x[:1] in "+-" and not x.startswith(("+++", "---"))]


def _no_device(line: str) -> str:
    """The line without what says where a tensor lives (CPU-only tests cannot see it)."""
    line = re.sub(r"device=[\w.]+,? ?", "", line)
    line = re.sub(r"\.to\(([\w.]+\.device|None)\)", "", line)
    line = re.sub(r"_unit\(([\w.]+), (dev|None)?\)", r"_unit(\1)", line)
    line = re.sub(r", [\w.]+\.device\)", ", None)", line)  # a positional device argument
    return line.replace("dev = None", "dev = h.device").replace(", )", ")")


def _no_dtype(line: str) -> str:
    """torch.tensor of Python floats is float32 and of ints int64 by default, as np.arange of ints
    is int64 on Linux: the same array."""
    line = re.sub(r"dtype=(torch\.float32|torch\.long|np\.int64|None),? ?", "", line)
    return line.replace(", )", ")")


# Functions no test of their own package calls, tested in another package (name prefix -> where).
# (ie-core's jacobian_lens_topk was one; it has ie-core unit tests now.) Also functions whose
# only tests are in the package but outside its mutation selection.
# (ie-eager's special-family tests were; they are in its selection now.)
ELSEWHERE: dict[str, str] = {}


def category(name: str, lines: list[str]) -> str:
    if name in EQUIVALENT:
        return "equivalent"
    if any(name.startswith(prefix) for prefix in ELSEWHERE):
        return "elsewhere"
    old = [x[1:] for x in lines if x.startswith("-")]
    new = [x[1:] for x in lines if x.startswith("+")]
    if old and len(old) == len(new):
        pairs = list(zip(old, new, strict=True))
        if all(_STRING.sub('""', a) == _STRING.sub('""', b) for a, b in pairs):
            return "message"
        if all(_no_device(a) == _no_device(b) for a, b in pairs):
            return "device"
        if all(_no_dtype(a) == _no_dtype(b) for a, b in pairs) and any("dtype=" in a for a in old):
            return "default dtype"
        label = re.compile(r"\b(label|name|\"\w+\")(?=\s*[,)])|None(?=\s*[,)])")
        if all(label.sub("L", a).replace(", )", ")") == label.sub("L", b).replace(", )", ")")
               for a, b in pairs) and any("label" in a or '"' in a for a in old):  # fmt: skip
            return "message"
    if new and all(x.strip() in ("None", "None,") for x in new) and all('"' in x for x in old):
        return "message"
    if len(new) == 1 and re.search(r"Error\(None\)", new[0]):
        return "message"
    return "open"


_INTRO = (
    "Command: `scripts/mutation.sh` (niced, one package at a time; configuration: the "
    "`[tool.mutmut]` table of each package's pyproject.toml). mutmut works per project "
    "directory, so each package is one run against its own fast unit tests (no vLLM engine); "
    "ie-eager's run uses a subset of its synthetic-model tests. Each mutant is one small change "
    "to a module; it is killed when one of those tests fails (timeouts count as killed). A mutant "
    "not killed is `message` (it changes only the words of an error message, or the label a "
    "message names, where no test pins the sentence), `device` (it drops a device argument, which "
    "a CPU-only suite cannot see), `default dtype` (it drops a dtype that is torch's default for "
    "that data: float32, int64), `equivalent` (same result for every input; reason below) or "
    "`open` (a test should kill it); `elsewhere`: a function only another package's tests call "
    "(counted as not killed). Score = killed / (mutants - message - device - default "
    "dtype - equivalent); raw = killed / mutants. `not run`: mutants a stopped run did not "
    "reach (outside every other column)."
)
_EXCLUDED = ("message", "device", "default dtype", "equivalent")


def _row(label: str, n: int, killed: int, cats: Counter[str]) -> str:
    """One table row; mutants a stopped run never reached count nowhere but their own column."""
    n -= cats["not run"]
    excluded = sum(cats[c] for c in _EXCLUDED)
    score = 100.0 * killed / max(n - excluded, 1)
    elsewhere = f" + {cats['elsewhere']} elsewhere" if cats["elsewhere"] else ""
    return (
        f"| {label} | {n} | {killed} | {n - killed} | {cats['message']} | {cats['device']} | "
        f"{cats['default dtype']} | {cats['equivalent']} | {cats['open']}{elsewhere} | "
        f"{score:.1f}% (raw {100.0 * killed / max(n, 1):.1f}%) | {cats['not run']} |"
    )


def _module(
    mutants: Path, module: str, of: dict[str, str], rerun: bool
) -> tuple[int, Counter[str], list[str]]:
    """(killed, categories of the rest, their detail lines) for one module's mutants. After a
    survivors rerun (`rerun`), mutmut lists the full run's kills as not checked when the
    configuration changed in between (a test file added): they stay killed, as tests were only
    added."""
    sources = _sources(mutants, module)
    cats: Counter[str] = Counter()
    killed, detail = 0, []
    for name, status in sorted(of.items()):
        if status in ("killed", "timeout"):
            killed += 1
            continue
        if status == "not checked" and rerun:  # killed in the full run; only survivors reran
            killed += 1
            continue
        if status == "not checked":  # the run was stopped before this mutant
            cats["not run"] += 1
            continue
        d = diff(sources, name)
        cat = category(name, d)
        cats[cat] += 1
        why = f" ({EQUIVALENT[name]})" if cat == "equivalent" else ""
        why += "".join(f" (tested in {w})" for p, w in ELSEWHERE.items() if name.startswith(p))
        detail.append(f"- `{name}` {status}, **{cat}**{why}: `{' / '.join(d)[:240]}`")
    return killed, cats, detail


def report(runs: list[tuple[Path, dict[str, str], str]]) -> str:
    """`runs`: (package dir, mutmut results, its run time in words) per package."""
    times = ", ".join(f"{p.name} {s}" for p, _, s in runs)
    lines = [
        "# Mutation testing",
        "",
        "<!-- Generated by scripts/mutation.sh (mutmut 3.8.1). Do not edit by hand. -->",
        "",
        _INTRO,
        "",
        f"Run time on the shared 2-core CPU, under load from other jobs: {times}.",
        "",
        "| module | mutants | killed | not killed | message | device | default dtype | "
        "equivalent | open | score | not run |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    detail: list[str] = []
    total: Counter[str] = Counter()
    n_all = killed_all = 0
    for package, results, _ in runs:
        by_module: dict[str, dict[str, str]] = {}
        for name, status in results.items():
            by_module.setdefault(_module_name(name), {})[name] = status
        for module, of in sorted(by_module.items()):
            rerun = (package / "mutants" / "rerun_seconds.txt").exists()
            killed, cats, more = _module(package / "mutants", module, of, rerun)
            lines.append(_row(f"`{module}`", len(of), killed, cats))
            detail += [f"{x} ({package.name})" for x in more]
            total.update(cats)
            n_all, killed_all = n_all + len(of), killed_all + killed
    lines.append(_row("all", n_all, killed_all, total))
    lines += ["", "Not killed, with the diff (`mutmut show NAME` in that package's folder):", ""]
    return "\n".join([*lines, *(detail or ["- none"])]) + "\n"


def parse(text: str) -> dict[str, str]:
    return {m["name"]: m["status"].strip() for m in map(_LINE.match, text.splitlines()) if m}


def main() -> None:
    runs = []
    for arg in sys.argv[1:]:
        package = Path(arg)
        results = parse((package / "mutants" / "results.txt").read_text())
        seconds = (package / "mutants" / "seconds.txt").read_text().strip() + " s"
        rerun = package / "mutants" / "rerun_seconds.txt"
        if rerun.exists():
            seconds += f" + {rerun.read_text().strip()} s rerunning the survivors after new tests"
        named = package / "mutants" / "named_rerun_seconds.txt"  # a stopped run's survivors
        if named.exists():
            seconds += f" + {named.read_text().strip()} s rerunning named survivors after new tests"
        runs.append((package, results, seconds))
    print(report(runs), end="")


if __name__ == "__main__":
    main()
