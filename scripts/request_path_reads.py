"""Counts for issue #63 ("read-outs as plan items"), beside `request_path_counts.py`'s, over the
root of a checkout (standard library `ast` only, so any old checkout reads):

- getattr probes: `getattr(x, NAME, None)` calls in ie-core (a lookup that allows absence) whose
  NAME is a method (not a property) of a backend's model class, or a parameter of the enclosing
  function (a method the caller names);
- plan routes: `ie serve`'s `/v1/ie` routes whose handler reads a `Plan` (`PLAN_BUILDERS`:
  `_plan(...)`, `_decode_plan(...)`, `Plan(...)` or `Plan.from_wire`), of the routes that run
  the model (POST, handler takes `_model(request)`), of all routes in `ie_core/wire.py`'s
  `ROUTES`;
- reducer files: the files holding code of one reducer, the linear probe: its maths as a reducer
  (a class whose `kind` is "probe", or the worker's `_probe`), its registry entry (a module-level
  table naming either), each backend's own read-out method for it (`probe_scores` /
  `probe_reducer` in a backend package), a route of its own body, a getattr probe for it;
- action tests: `x.kind == "..."` / `!=` comparisons with a string in ie_eager/hooks.py and
  ie_eager/actions.py (the hooks' action types);
- worker duplicates: those pairs between hooked vLLM's worker extension and vllm-static's worker
  (a file's repeats of itself left out);
- duplicates: pairs of places that repeat the same 4 significant lines (not blank, comment,
  docstring or import lines; indentation ignored; at least 80 characters together), each repeat
  counted once at its first line however long it runs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

BACKEND_SRC = ("ie-eager", "ie-vllm", "ie-static", "ie-remote")
PROBE_METHODS = frozenset({"probe_scores", "probe_reducer"})
DUP_LINES, DUP_CHARS = 4, 80
# What a route handler calls to read its request as a plan: the JSON body's (`_plan`), the
# residual rows' (`_decode_plan`), or a `Plan` built or read in place.
PLAN_BUILDERS = ("_plan", "_decode_plan", "Plan", "Plan.from_wire")


def _py(root: Path, pattern: str) -> list[Path]:
    return sorted(p for p in root.glob(pattern) if p.suffix == ".py")


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def backend_methods(root: Path) -> set[str]:
    """Methods (not properties) of the backends' model classes (`EagerModel`, `VLLMModel`, ...)."""
    names = set()
    for package in BACKEND_SRC:
        for path in _py(root, f"packages/{package}/src/**/*"):
            for cls in ast.walk(_tree(path)):
                if not isinstance(cls, ast.ClassDef) or not cls.name.endswith("Model"):
                    continue
                for f in cls.body:
                    if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) and not any(
                        "property" in ast.unparse(d) for d in f.decorator_list
                    ):
                        names.add(f.name)
    return names


def getattr_probes(root: Path, methods: set[str]) -> list[str]:
    """`file:line name` of each probe in ie-core's sources."""
    found = []
    for path in _py(root, "packages/ie-core/src/**/*"):
        for func in ast.walk(_tree(path)):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            params = {a.arg for a in [*func.args.args, *func.args.kwonlyargs]}
            for node in ast.walk(func):
                if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr"):
                    continue
                if len(node.args) != 3 or ast.unparse(node.args[2]) != "None":
                    continue  # not a lookup that allows absence
                name = node.args[1]
                if isinstance(name, ast.Constant):
                    hit, label = name.value in methods, str(name.value)
                else:  # a method named by the caller
                    hit, label = isinstance(name, ast.Name) and name.id in params, ast.unparse(name)
                if hit:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {label}")
    return sorted(set(found))


def _strings(tree: ast.Module) -> dict[str, str]:
    return {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
        and isinstance(n.value.value, str)
        for t in n.targets
        if isinstance(t, ast.Name)
    }  # fmt: skip


def _route_methods(root: Path) -> dict[str, str]:
    """Route name -> HTTP method, from `ROUTES` in ie_core/wire.py."""
    out: dict[str, str] = {}
    wire = root / "packages/ie-core/src/ie_core/wire.py"
    for node in ast.walk(_tree(wire)) if wire.is_file() else ():
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and isinstance(v, ast.Call) and v.args:
                    method = v.args[0]
                    if isinstance(method, ast.Constant):
                        out[str(k.value)] = str(method.value)
    return out


def _mounted(call: ast.expr, names: dict[str, str]) -> str | None:
    """The route name in `x.api_route(**mount(NAME))`, else None."""
    if not (isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "api_route"):
        return None
    for kw in call.keywords:
        inner = kw.value
        if kw.arg is None and isinstance(inner, ast.Call) and inner.args:
            arg = inner.args[0]
            if isinstance(arg, ast.Constant):
                return str(arg.value)
            if isinstance(arg, ast.Name):
                return names.get(arg.id, arg.id)
    return None


def plan_routes(root: Path) -> dict[str, list[str]]:
    """Route names: all, those that run the model, those whose handler reads a plan."""
    plan_path = root / "packages/ie-core/src/ie_core/plan.py"
    names = _strings(_tree(plan_path)) if plan_path.is_file() else {}
    handlers: dict[str, ast.AST] = {}
    trees = [_tree(p) for p in _py(root, "packages/ie-vllm/src/ie_vllm/server/http_*")]
    bodies = {
        f.name: f
        for tree in trees
        for f in tree.body
        if isinstance(f, ast.AsyncFunctionDef | ast.FunctionDef)
    }
    for tree in trees:
        for f in tree.body:
            for d in getattr(f, "decorator_list", ()):
                if (route := _mounted(d, names)) is not None:
                    handlers[route] = f
        for node in tree.body:  # `router.api_route(**mount(NAME))(handler)`
            call = node.value if isinstance(node, ast.Expr) else None
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Call):
                route = _mounted(call.func, names)
                target = call.args[0] if call.args else None
                if route is not None and isinstance(target, ast.Name) and target.id in bodies:
                    handlers[route] = bodies[target.id]
    methods = _route_methods(root)

    def calls(f: ast.AST, *wanted: str) -> bool:
        return any(isinstance(n, ast.Call) and ast.unparse(n.func) in wanted for n in ast.walk(f))

    model = [r for r, f in handlers.items() if methods.get(r) == "POST" and calls(f, "_model")]
    plans = [r for r, f in handlers.items() if calls(f, *PLAN_BUILDERS)]
    return {"all": sorted(methods), "model": sorted(model), "plan": sorted(plans)}


def reducer_files(root: Path) -> list[str]:
    found = set()
    for path in _py(root, "packages/*/src/**/*"):
        if path.name == "__init__.py":
            continue
        tree, rel, package = (
            _tree(path),
            str(path.relative_to(root)),
            path.parts[len(root.parts) + 1],
        )
        kinds = {
            c.name
            for c in tree.body
            if isinstance(c, ast.ClassDef)
            and any(
                isinstance(s, ast.AnnAssign | ast.Assign)
                and isinstance(s.value, ast.Constant)
                and s.value.value == "probe"
                and "kind" in ast.unparse(s)
                for s in c.body
            )
        }
        kinds |= {
            f.name for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "_probe"
        }
        tables = {n.id for s in tree.body if isinstance(s, ast.Assign | ast.AnnAssign)
                  for n in ast.walk(s.value or ast.Pass()) if isinstance(n, ast.Name)}  # type: ignore[arg-type]  # fmt: skip
        own_methods = package in BACKEND_SRC and any(
            isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) and f.name in PROBE_METHODS
            and not any(_mounted(d, {}) for d in f.decorator_list)
            for f in ast.walk(tree)
        )  # fmt: skip
        own_route = any(
            isinstance(f, ast.AsyncFunctionDef)
            and any(_mounted(d, {}) == "probe_scores" for d in f.decorator_list)
            for f in tree.body
        )
        probe = any(
            isinstance(n, ast.Call) and getattr(n.func, "id", None) == "getattr"
            and len(n.args) > 1 and isinstance(n.args[1], ast.Constant)
            and n.args[1].value in PROBE_METHODS
            for n in ast.walk(tree)
        )  # fmt: skip
        registry = bool(_registered_reducers(root) & tables) and "kinds" in path.name
        if kinds or own_methods or own_route or probe or registry or (tables & {"_probe"}):
            found.add(rel)
    return sorted(found)


def _registered_reducers(root: Path) -> set[str]:
    names = set()
    for path in _py(root, "packages/*/src/**/*"):
        for c in _tree(path).body:
            if isinstance(c, ast.ClassDef) and any(
                isinstance(s, ast.AnnAssign) and "kind" in ast.unparse(s.target)
                and isinstance(s.value, ast.Constant) and s.value.value == "probe"
                for s in c.body
            ):  # fmt: skip
                names.add(c.name)
    return names


def action_tests(root: Path) -> int:
    """`.kind ==` / `!=` against a string in eager's hooks and their action types."""
    folder = root / "packages/ie-eager/src/ie_eager"
    paths = [p for p in (folder / "hooks.py", folder / "actions.py") if p.is_file()]
    count = 0
    for node in (n for p in paths for n in ast.walk(_tree(p))):
        if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.Eq | ast.NotEq):
            sides = [node.left, *node.comparators]
            kind = any(isinstance(s, ast.Attribute) and s.attr == "kind" for s in sides)
            text = any(isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides)
            count += kind and text
    return count


def significant_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, stripped text) of lines that are code: not blank, a comment, a docstring or
    an import."""
    text = path.read_text(encoding="utf-8")
    left_out: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            left_out.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
        if isinstance(node, ast.Import | ast.ImportFrom):
            left_out.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    lines = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and number not in left_out:
            lines.append((number, stripped))
    return lines


def duplicates(paths: Iterable[Path]) -> list[tuple[str, str]]:
    """Pairs `file:line` that start the same run of DUP_LINES significant lines."""
    seen: dict[str, list[tuple[str, int]]] = {}
    numbers: dict[tuple[str, int], int] = {}
    for path in paths:
        lines = significant_lines(path)
        for i in range(len(lines) - DUP_LINES + 1):
            window = [text for _, text in lines[i : i + DUP_LINES]]
            numbers[(str(path), i)] = lines[i][0]
            if sum(map(len, window)) >= DUP_CHARS:
                seen.setdefault("\n".join(window), []).append((str(path), i))
    pairs = {(a, b) for where in seen.values() for a, b in _pairs(where)}
    kept = []
    for a, b in sorted(pairs):
        if ((a[0], a[1] - 1), (b[0], b[1] - 1)) in pairs:
            continue  # the same repeat, a line on
        if a[0] == b[0] and abs(a[1] - b[1]) < DUP_LINES:
            continue  # a run overlapping itself
        kept.append((f"{a[0]}:{numbers[a]}", f"{b[0]}:{numbers[b]}"))
    return kept


def _pairs(where: list[tuple[str, int]]) -> Iterator[tuple[tuple[str, int], tuple[str, int]]]:
    for i, a in enumerate(where):
        for b in where[i + 1 :]:
            yield a, b


def source_files(root: Path) -> list[Path]:
    return _py(root, "packages/*/src/**/*") + _py(root, "apps/*/src/**/*")


WORKERS = (
    "packages/ie-vllm/src/ie_vllm/worker/extension.py",
    "packages/ie-static/src/ie_static/worker.py",
)


def measure(root: Path) -> dict[str, object]:
    probes = getattr_probes(root, backend_methods(root))
    routes = plan_routes(root)
    files = reducer_files(root)
    paths = [root / p for p in WORKERS if (root / p).is_file()]
    workers = [(a, b) for a, b in duplicates(paths) if a.rsplit(":", 1)[0] != b.rsplit(":", 1)[0]]
    outside = duplicates(source_files(root))
    return {
        "getattr_probes": len(probes),
        "getattr_probe_sites": probes,
        "routes": len(routes["all"]),
        "model_routes": len(routes["model"]),
        "plan_routes": len(routes["plan"]),
        "route_names": routes,
        "reducer_files": len(files),
        "reducer_file_names": files,
        "worker_duplicates": len(workers),
        "action_kind_tests": action_tests(root),
        "duplicates_outside_tests": len(outside),
    }


__all__ = ["duplicates", "measure", "source_files"]
