"""Counts for issue #42 ("One request path") over packages/*/src and apps/*/src of a checkout,
and issue #63's (read-outs as plan items; `request_path_reads.py`, summed over the checkout).

    uv run --locked python scripts/request_path_counts.py [--root DIR] [--json]
    uv run --locked python scripts/request_path_counts.py duplicates PATH...  (files or folders)

Standard library `ast` only, so it runs on any old checkout. Per package:
- op sites: `isinstance(x, C)` calls and `case C(...)` patterns where C names an op class: the
  classes ie_core/ops/kinds.py lists; without that file, those an `OP_KINDS` dict names plus every
  class of ie_core/interventions.py and feature_ops.py (the old homes; OP_KINDS left Hook out);
- vllm generate tests: `==`, `!=`, `in`, `not in`, `case` against "vllm-generate" or a
  module-level name bound to it (`GENERATE = "vllm-generate"`, in the module or imported);
- backend names (ie-core): string literals naming a backend or its module, and imports of one,
  outside docstrings and exception / warning messages;
- circles: strongly connected components (2+ modules) of the package's module-level imports (not
  under `if TYPE_CHECKING:`); `from a.b import c` reaches a.b.c where it is a module, else a.b;
- hidden: the circles with every import counted, inside functions and under TYPE_CHECKING too
  (the circles those imports hold apart), and up: the imports inside those circles that run from
  a subpackage up to a parent package's module;
- function imports: import statements inside function bodies (stdlib included).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from request_path_reads import duplicates
from request_path_reads import measure as measure_reads

BACKEND_NAMES = frozenset({"eager", "vllm", "vllm-static", "vllm-generate", "remote"})
BACKEND_MODULES = frozenset({"ie_eager", "ie_vllm", "ie_static", "ie_remote"})
COMPARISONS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
METRICS: tuple[str, ...] = (
    "op_sites",
    "vllm_generate_tests",
    "backend_names",
    "circles",
    "hidden",
    "up",
)
METRICS += ("function_imports",)


@dataclass(frozen=True)
class Source:
    package: str  # the distribution's folder: ie-core, dashboard, ...
    module: str  # dotted: ie_core.ops.patch
    is_init: bool
    tree: ast.Module


def read_sources(root: Path) -> list[Source]:
    found = []
    for src in sorted([*root.glob("packages/*/src"), *root.glob("apps/*/src")]):
        for path in sorted(src.rglob("*.py")):
            rel = path.relative_to(src).with_suffix("")
            is_init = rel.name == "__init__"
            parts = rel.parts[:-1] if is_init else rel.parts
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            found.append(Source(src.parent.name, ".".join(parts), is_init, tree))
    return found


def class_names(node: ast.expr) -> Iterator[str]:
    """The class names in isinstance's second argument or a case pattern: C, m.C, (A, B), A | B."""
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, ast.Attribute):
        yield node.attr
    elif isinstance(node, ast.Tuple):
        for element in node.elts:
            yield from class_names(element)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        yield from class_names(node.left)
        yield from class_names(node.right)


def registered(tree: ast.Module, only: str | None = None) -> set[str]:
    """Names in a module's top-level tuples, lists and dict values (optionally one name's only)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if only and not any(isinstance(t, ast.Name) and t.id == only for t in targets):
            continue
        elements = value.values if isinstance(value, ast.Dict) else getattr(value, "elts", [])
        names.update(e.id for e in elements if isinstance(e, ast.Name))
    return names


def op_classes(sources: list[Source]) -> tuple[set[str], str]:
    core = {s.module: s for s in sources if s.package == "ie-core"}
    if "ie_core.ops.kinds" in core:
        return registered(core["ie_core.ops.kinds"].tree), "ie_core/ops/kinds.py"
    names = set().union(*(registered(s.tree, only="OP_KINDS") for s in core.values()))
    for old_home in ("ie_core.interventions", "ie_core.feature_ops"):
        if old_home in core:
            names |= {n.name for n in core[old_home].tree.body if isinstance(n, ast.ClassDef)}
    return names, "fallback: OP_KINDS + classes of interventions.py / feature_ops.py"


def op_sites(tree: ast.Module, ops: set[str]) -> int:
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "isinstance" and len(node.args) == 2:
                count += any(name in ops for name in class_names(node.args[1]))
        elif isinstance(node, ast.MatchClass):
            count += any(name in ops for name in class_names(node.cls))
    return count


def string_values(node: ast.expr) -> Iterator[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.Tuple | ast.List | ast.Set):
        for element in node.elts:
            yield from string_values(element)


def generate_constants(sources: list[Source]) -> set[tuple[str, str]]:
    """(module, name) of every module-level `NAME = "vllm-generate"`."""
    return {
        (s.module, target.id)
        for s in sources
        for node in s.tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and node.value.value == "vllm-generate"
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def vllm_generate_tests(source: Source, constants: set[tuple[str, str]]) -> int:
    aliases = {name for module, name in constants if module == source.module}
    for node in ast.walk(source.tree):
        if isinstance(node, ast.ImportFrom):
            base = import_base(node, source)
            aliases |= {a.asname or a.name for a in node.names if (base, a.name) in constants}

    def names_it(operand: ast.expr) -> bool:
        if isinstance(operand, ast.Name):
            return operand.id in aliases
        return "vllm-generate" in string_values(operand)

    count = 0
    for node in ast.walk(source.tree):
        if isinstance(node, ast.Compare) and any(isinstance(op, COMPARISONS) for op in node.ops):
            count += any(names_it(operand) for operand in [node.left, *node.comparators])
        elif isinstance(node, ast.MatchValue):
            count += names_it(node.value)
    return count


def names_backend(text: str) -> bool:
    return text in BACKEND_NAMES or text.split(".")[0] in BACKEND_MODULES


def is_message(node: ast.AST) -> bool:
    """A raise, or a call building an exception / warning (its arguments are messages)."""
    if isinstance(node, ast.Raise):
        return True
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    return name in {"warn", "warning"} or name.endswith(("Error", "Exception", "Warning"))


def backend_names(tree: ast.Module) -> int:
    def visit(node: ast.AST) -> int:
        if is_message(node) or (
            isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        ):
            return 0  # a message, or a bare string: a docstring
        here = 0
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            here = names_backend(node.value)
        elif isinstance(node, ast.Import):
            here = sum(names_backend(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            here = names_backend(node.module)
        return here + sum(visit(child) for child in ast.iter_child_nodes(node))

    return visit(tree)


def imports(nodes: Iterable[ast.AST], where: str = "top") -> Iterator[tuple[ast.stmt, str]]:
    """Every import statement and where it sits: "top", "function" or "typing" (TYPE_CHECKING)."""
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, where
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in class_names(node.test):
            yield from imports(node.body, "function" if where == "function" else "typing")
            yield from imports(node.orelse, where)
        else:
            inside = "function" if isinstance(node, FUNCTIONS) else where
            yield from imports(ast.iter_child_nodes(node), inside)


def import_base(statement: ast.ImportFrom, source: Source) -> str:
    """The absolute module a `from ... import` reads from."""
    if not statement.level:
        return statement.module or ""
    package = source.module.split(".")[: None if source.is_init else -1]
    package = package[: len(package) - statement.level + 1]
    return ".".join([*package, *([statement.module] if statement.module else [])])


def targets(statement: ast.stmt, source: Source, modules: dict[str, Source]) -> set[str]:
    """The package's modules an import statement reaches (itself left out)."""
    if isinstance(statement, ast.Import):
        reached = {alias.name for alias in statement.names}
    else:
        assert isinstance(statement, ast.ImportFrom)
        base = import_base(statement, source)
        reached = {
            f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in statement.names
        }
    return (reached & modules.keys()) - {source.module}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph[todo.pop()] - seen:
            seen.add(w)
            todo.append(w)
    return seen


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module: modules that reach each other."""
    reach = {v: reachable(graph, v) for v in graph}
    found = {tuple(sorted(w for w in reach[v] if v in reach[w])) for v in graph if v in reach[v]}
    return sorted(list(c) for c in found if len(c) > 1)


def home(module: str, modules: dict[str, Source]) -> str:
    """The package a module sits in (a package's __init__ is its own)."""
    return module if modules[module].is_init else module.rpartition(".")[0]


def ups(components: list[list[str]], graph: dict[str, set[str]], modules: dict[str, Source]) -> int:
    """Imports inside a circle from a module of a subpackage to a module of a parent package."""
    return sum(
        home(u, modules).startswith(home(v, modules) + ".")
        for component in components
        for u in component
        for v in graph[u] & set(component)
    )


@dataclass
class Counts:
    root: str
    op_source: str
    op_classes: list[str]
    packages: dict[str, dict[str, int]]
    total: dict[str, int]
    circles: dict[str, list[list[str]]]
    hidden_circles: dict[str, list[list[str]]]
    reads: dict[str, object]


def measure(root: Path) -> Counts:
    sources = read_sources(root)
    ops, op_source = op_classes(sources)
    constants = generate_constants(sources)
    counts = Counts(str(root), op_source, sorted(ops), {}, {}, {}, {}, measure_reads(root))
    for package in sorted({s.package for s in sources}):
        modules = {s.module: s for s in sources if s.package == package}
        top: dict[str, set[str]] = {m: set() for m in modules}
        every: dict[str, set[str]] = {m: set() for m in modules}
        row = dict.fromkeys(METRICS, 0)
        for module, source in modules.items():
            row["op_sites"] += op_sites(source.tree, ops)
            row["vllm_generate_tests"] += vllm_generate_tests(source, constants)
            if package == "ie-core":
                row["backend_names"] += backend_names(source.tree)
            for statement, where in imports(source.tree.body):
                row["function_imports"] += where == "function"
                every[module] |= targets(statement, source, modules)
                if where == "top":
                    top[module] |= targets(statement, source, modules)
        counts.circles[package] = circles(top)
        counts.hidden_circles[package] = circles(every)
        row["circles"] = len(counts.circles[package])
        row["up"] = ups(counts.hidden_circles[package], every, modules)
        row["hidden"] = len(counts.hidden_circles[package])
        counts.packages[package] = row
    counts.total = {key: sum(row[key] for row in counts.packages.values()) for key in METRICS}
    return counts


def table(counts: Counts) -> str:
    rows = {**counts.packages, "total": counts.total}
    headers = [key.replace("_", " ") for key in METRICS]
    lines = [f"root: {counts.root}", f"op classes ({counts.op_source}): {counts.op_classes}"]
    lines.append(f"{'package':<11}" + "".join(f"{h:>{len(h) + 2}}" for h in headers))
    for name, row in rows.items():
        lines.append(
            f"{name:<11}"
            + "".join(f"{row[k]:>{len(h) + 2}}" for k, h in zip(METRICS, headers, strict=True))
        )
    for label, found in (("circle", counts.circles), ("hidden circle", counts.hidden_circles)):
        lines += [f"{label} in {p}: {' '.join(c)}" for p, cs in found.items() for c in cs]
    r = counts.reads
    lines += [
        f"getattr probes for backend methods in ie-core: {r['getattr_probes']}",
        f"routes carrying a plan: {r['plan_routes']} (of {r['model_routes']} that run the model, "
        f"{r['routes']} routes)",
        f"files a new reducer touches (the probe's): {r['reducer_files']}",
        f"duplicate pairs between the two workers: {r['worker_duplicates']}",
        f"string tests of action kinds in eager's hooks: {r['action_kind_tests']}",
        f"duplicate pairs outside tests: {r['duplicates_outside_tests']}",
    ]
    return "\n".join(lines)


def print_duplicates(paths: list[str]) -> None:
    """Each repeated run of lines (`request_path_reads.duplicates`) in the files or folders."""
    files = sorted(f for p in map(Path, paths) for f in ([p] if p.is_file() else p.rglob("*.py")))
    pairs = duplicates(files)
    for a, b in pairs:
        print(f"{a}  {b}")
    print(f"{len(pairs)} duplicate pairs in {len(files)} files")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["duplicates"]:
        print_duplicates(argv[1:])
        return
    parser = argparse.ArgumentParser(description="Counts for issues #42 and #63 over a checkout.")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    counts = measure(args.root.resolve())
    print(json.dumps(asdict(counts), indent=2) if args.json else table(counts))


if __name__ == "__main__":
    main()
