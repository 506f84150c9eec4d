"""The committed mutation report (docs/notes/mutation.md) from mutmut's results: killed /
survived per module, the score, and every mutant not killed with its diff and category.

Categories of a mutant not killed: `message` (it changes only the words of an error message or
the label a message names, where no test pins the sentence), `device` (it drops a `device=`
argument: the CPU suite cannot tell devices apart), `default dtype`, `equivalent` (same result for
every input, reason in mutation_equivalent.py), else `open` (a test should kill it).

Each package's summary (rows, run time, detail lines) is kept in docs/notes/mutation.json, so a
run of some packages keeps the others' last results without their local mutmut state. Usage:
mutation_report.py PACKAGE_DIR... (each with mutants/results.txt and mutants/seconds.txt); writes
the JSON and prints the markdown.
"""

from __future__ import annotations

import ast
import difflib
import json
import re
import sys
from collections import Counter
from pathlib import Path

from mutation_equivalent import EQUIVALENT

STATE = Path(__file__).resolve().parent.parent / "docs" / "notes" / "mutation.json"

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


def summary(package: Path, results: dict[str, str], seconds: str) -> dict:
    """One package's rows and detail lines, as kept in the JSON state."""
    by_module: dict[str, dict[str, str]] = {}
    for name, status in results.items():
        by_module.setdefault(_module_name(name), {})[name] = status
    rerun = (package / "mutants" / "rerun_seconds.txt").exists()
    modules, detail = {}, []
    for module, of in sorted(by_module.items()):
        killed, cats, more = _module(package / "mutants", module, of, rerun)
        modules[module] = {"mutants": len(of), "killed": killed, "categories": dict(cats)}
        detail += [f"{x} ({package.name})" for x in more]
    return {"seconds": seconds, "modules": modules, "detail": detail}


def report(state: dict[str, dict]) -> str:
    """`state`: package name -> its summary."""
    times = ", ".join(f"{name} {s['seconds']}" for name, s in sorted(state.items()))
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
    modules = {m: row for s in state.values() for m, row in s["modules"].items()}
    for module, row in sorted(modules.items()):
        cats = Counter(row["categories"])
        lines.append(_row(f"`{module}`", row["mutants"], row["killed"], cats))
        total.update(cats)
        n_all, killed_all = n_all + row["mutants"], killed_all + row["killed"]
    for _, s in sorted(state.items()):
        detail += s["detail"]
    lines.append(_row("all", n_all, killed_all, total))
    lines += ["", "Not killed, with the diff (`mutmut show NAME` in that package's folder):", ""]
    return "\n".join([*lines, *(detail or ["- none"])]) + "\n"


def parse(text: str) -> dict[str, str]:
    return {m["name"]: m["status"].strip() for m in map(_LINE.match, text.splitlines()) if m}


def _seconds(package: Path) -> str:
    seconds = (package / "mutants" / "seconds.txt").read_text().strip() + " s"
    rerun = package / "mutants" / "rerun_seconds.txt"
    if rerun.exists():
        seconds += f" + {rerun.read_text().strip()} s rerunning the survivors after new tests"
    named = package / "mutants" / "named_rerun_seconds.txt"  # a stopped run's survivors
    if named.exists():
        seconds += f" + {named.read_text().strip()} s rerunning named survivors after new tests"
    return seconds


def main() -> None:
    state = json.loads(STATE.read_text()) if STATE.exists() else {}
    for arg in sys.argv[1:]:
        package = Path(arg)
        results = parse((package / "mutants" / "results.txt").read_text())
        state[package.name] = summary(package, results, _seconds(package))
    STATE.write_text(json.dumps(state, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    print(report(state), end="")


if __name__ == "__main__":
    main()
