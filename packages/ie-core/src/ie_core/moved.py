"""Module paths that moved, still importable for a release: `ie_core.patching` is
`ie_core.experiments.patching` (the same module object), with a DeprecationWarning that names the
new path. Removed in 0.3.0 (CHANGELOG.md says so).

The old paths were public in USAGE before ie-core's folders (#42) and the ops modules (#42) moved
them. A finder on `sys.meta_path` answers for exactly these names, so no file is left behind at
the old place; `ie_core.<old>` as an attribute goes through `ie_core.__getattr__` here too.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

__all__ = ["MOVED", "REMOVED_IN", "install", "load_moved"]

REMOVED_IN = "0.3.0"
MOVED: dict[str, str] = {
    **{
        f"ie_core.{name}": f"ie_core.experiments.{name}"
        for name in (
            "analysis", "feature_stream", "features", "jacobian_lens", "lens_stream", "patching",
            "ragged", "sae_math", "saes", "splice", "user_hooks",
        )
    },
    **{
        f"ie_core.{name}": f"ie_core.tooling.{name}"
        for name in (
            "benchmark_load", "capability_cli", "capability_sweep", "cli", "docs",
            "load_sampling", "records",
        )
    },
    "ie_core.steering": "ie_core.ops",
}  # fmt: skip


_OURS = {__file__, __file__.replace("moved.py", "__init__.py")}


def _caller_stacklevel() -> int:
    """The stack level of the first frame outside this module and the import machinery, so the
    warning names the user's import line (Python shows a DeprecationWarning from user code).
    `warnings` itself skips importlib's frames, so only ours are counted."""
    level, frame = 2, sys._getframe(2)  # 0: here, 1: load_moved, 2: its caller
    while frame is not None:
        name = frame.f_code.co_filename
        if name in _OURS:
            level += 1
        elif not name.startswith("<frozen importlib"):
            break
        frame = frame.f_back  # type: ignore[assignment]
    return level


def load_moved(old: str) -> ModuleType:
    """The module now at `MOVED[old]`, after a DeprecationWarning naming both paths."""
    new = MOVED[old]
    warnings.warn(
        f"{old} moved to {new}; import it from there (or the names from ie_core itself): the "
        f"old path is removed in {REMOVED_IN}",
        DeprecationWarning,
        stacklevel=_caller_stacklevel(),
    )
    return importlib.import_module(new)


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return load_moved(spec.name)  # the new module itself: its __spec__ and __name__ stay

    def exec_module(self, module: ModuleType) -> None:
        return None  # already executed under its new name


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _Loader())


_FINDER = _Finder()


def install() -> None:
    """Put the finder on `sys.meta_path` once (ie_core's `__init__` calls it)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
