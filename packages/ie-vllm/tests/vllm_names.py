"""Every vLLM name a Python file uses, read from its AST, and whether a vLLM source tree has it.

A name is used by `import vllm.x`, `from vllm.x import y` (at any depth: inside functions too), by
an attribute read on a name bound to vLLM (`vllm.x.y`; `alias.y` after `import vllm.x as alias`)
and by a keyword of a call of one (`SamplingParams(max_tokens=...)`). Names spelled in strings
(`getattr(runner, "...")`) are not seen here; the runner's are `runner_adapter.VLLM_NAMES`,
checked by test_runner_contract.py.

Resolving `module` + attributes against a source tree: descend into submodules while one exists;
the first remaining attribute must be bound at the module's top level (a def, class, assignment
or import, also under `if` / `try`, as vLLM's lazy `TYPE_CHECKING` imports are), a re-export
followed to its definition. A class's attribute must be one it or a base defines, a keyword one
its def (or class) accepts; what follows is an attribute of an object and is not checked.

    python packages/ie-vllm/tests/vllm_names.py   # the table of every name, file and line
"""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from vllm_sources import ROOT, Source, defined_names


@dataclass(frozen=True)
class VllmRef:
    """One use of a vLLM name: `module` then `attrs` (`from vllm.a import b` is `vllm.a`, `(b,)`)."""

    path: str  # relative to the tree it was read from
    line: int
    module: str
    attrs: tuple[str, ...] = ()
    keyword: str | None = None  # `f(keyword=...)` on the name

    @property
    def name(self) -> str:
        dotted = ".".join((self.module, *self.attrs))
        return f"{dotted}({self.keyword}=)" if self.keyword else dotted

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.name}"


Bound = dict[str, tuple[str, tuple[str, ...]]]  # local name -> (module, attrs)


def refs_in(text: str, path: str) -> list[VllmRef]:
    """Every vLLM name `text` imports or reads, in source order."""
    tree = ast.parse(text)
    bound: Bound = {}
    refs: list[VllmRef] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_vllm(alias.name):
                    refs.append(VllmRef(path, node.lineno, alias.name))
                    local = alias.asname or alias.name.split(".")[0]
                    bound[local] = (alias.name if alias.asname else "vllm", ())
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_vllm(node.module):
            assert node.module is not None
            for alias in node.names:
                refs.append(VllmRef(path, node.lineno, node.module, (alias.name,)))
                bound[alias.asname or alias.name] = (node.module, (alias.name,))
    refs += _attribute_reads(tree, bound, path)
    return sorted(set(refs), key=lambda r: (r.line, r.name))


def _is_vllm(module: str | None) -> bool:
    return module is not None and module.split(".")[0] == "vllm"


def _attribute_reads(tree: ast.AST, bound: Bound, path: str) -> Iterator[VllmRef]:
    """`x.a.b` for every bound `x` (the longest chain only: not also `x.a`), and the keywords of
    a call of a bound name (`SamplingParams(max_tokens=...)`)."""
    inner: set[int] = set()
    for node in ast.walk(tree):  # outer nodes come first: their inner chain is marked as seen
        if isinstance(node, ast.Call) and (named := _chain(node.func, bound)):
            yield from (
                VllmRef(path, node.lineno, *named, keyword=k.arg) for k in node.keywords if k.arg
            )
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue
        cursor: ast.expr = node
        while isinstance(cursor, ast.Attribute):
            inner.add(id(cursor))
            cursor = cursor.value
        if named := _chain(node, bound):
            yield VllmRef(path, node.lineno, *named)


def _chain(node: ast.expr, bound: Bound) -> tuple[str, tuple[str, ...]] | None:
    """(module, attrs) that `x.a.b` names when `x` is bound to vLLM, else None."""
    chain: list[str] = []
    while isinstance(node, ast.Attribute):
        chain.insert(0, node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in bound:
        return None
    module, attrs = bound[node.id]
    return module, (*attrs, *chain)


def project_files(root: Path = ROOT) -> list[Path]:
    """The project's Python files: tracked, or new and not ignored (a file not yet added counts)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [root / p for p in sorted(set(listed)) if (root / p).is_file()]


def project_refs(files: Iterable[Path], root: Path = ROOT) -> list[VllmRef]:
    refs: list[VllmRef] = []
    for file in files:
        text = file.read_text()
        if "vllm" in text:
            refs += refs_in(text, file.relative_to(root).as_posix())
    return refs


def unresolved_refs(read: Source, refs: Iterable[VllmRef]) -> list[str]:
    """`file:line: name: why` for each of `refs` that `read`'s tree lacks."""
    return [why for ref in refs if (why := unresolved(read, ref))]


def unresolved(read: Source, ref: VllmRef) -> str | None:
    """Why `ref` does not resolve on `read`'s tree, or None when it does."""
    if read(ref.module) is None:
        return f"{ref}: no module {ref.module}"
    module, attrs = ref.module, list(ref.attrs)
    while attrs and read(f"{module}.{attrs[0]}") is not None:
        module = f"{module}.{attrs.pop(0)}"
    if not attrs:
        return None
    found = locate(read, module, attrs[0])
    if found is None:
        return f"{ref}: {module} has no {attrs[0]}"
    owner, node = found
    if isinstance(node, ast.ClassDef) and len(attrs) > 1:
        if attrs[1] not in defined_names(read, owner, node.name):
            return f"{ref}: {owner}.{node.name} has no {attrs[1]}"
    elif ref.keyword and len(attrs) == 1:
        accepted = _parameters(read, owner, node)
        if accepted is not None and ref.keyword not in accepted:
            return f"{ref}: {owner}.{attrs[0]} takes no {ref.keyword}="
    return None


def locate(
    read: Source, module: str, name: str, seen: frozenset[str] = frozenset()
) -> tuple[str, ast.stmt] | None:
    """Where `name`, bound at `module`'s top level, is defined: a re-export is followed to its def
    or class; any other binding (an assignment, a non-vLLM import) is returned as found."""
    if f"{module}:{name}" in seen:  # modules that re-export from each other
        return None
    seen |= {f"{module}:{name}"}
    bindings = _bindings(read, module).get(name, [])
    for node in bindings:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            return module, node
    for node in bindings:
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            source = _absolute(read, module, node)
            original = next((a.name for a in node.names if (a.asname or a.name) == name), name)
            if source is not None and read(source) is not None:
                followed = locate(read, source, original, seen)
                if followed is not None:
                    return followed
    return (module, bindings[0]) if bindings else None


def _parameters(read: Source, module: str, node: ast.stmt) -> set[str] | None:
    """The keywords a def or class accepts; None where any is (`**kwargs`) or unknown."""
    if isinstance(node, ast.ClassDef):
        init = next((n for n in node.body if getattr(n, "name", "") == "__init__"), None)
        own = _parameters(read, module, init) if init is not None else set()
        return None if own is None else own | defined_names(read, module, node.name)
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.args.kwarg:
        return None
    return {a.arg for a in (*node.args.args, *node.args.kwonlyargs)}


def _bindings(read: Source, module: str) -> dict[str, list[ast.stmt]]:
    """Name -> the statements that bind it at `module`'s top level (a star import binds its
    module's names)."""
    text = read(module)
    out: dict[str, list[ast.stmt]] = {}
    for node in _top_level(ast.parse(text).body if text else []):
        names: list[str] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names = [node.name]
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        elif isinstance(node, ast.Import):
            names = [a.asname or a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.names[0].name == "*":
            source = _absolute(read, module, node)
            names = list(_bindings(read, source)) if source else []  # followed by `locate`
        elif isinstance(node, ast.ImportFrom):
            names = [a.asname or a.name for a in node.names]
        for name in names:
            out.setdefault(name, []).append(node)
    return out


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements run at import: the body, and inside if / try / with blocks, not defs."""
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.Try | ast.With | ast.For | ast.While):
            for block in ("body", "orelse", "finalbody"):
                yield from _top_level(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                yield from _top_level(handler.body)


def _absolute(read: Source, module: str, node: ast.ImportFrom) -> str | None:
    """The module an import names; a relative one counts from the importing module's package
    (the module itself when it is a package: its `__init__` is in the tree)."""
    if node.level == 0:
        return node.module
    package = module if read(f"{module}.__init__") is not None else module.rpartition(".")[0]
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


if __name__ == "__main__":
    found = project_refs(project_files())
    for ref in found:
        print(ref)
    files = {r.path for r in found}
    print(f"{len(found)} uses of {len({r.name for r in found})} names in {len(files)} files")
