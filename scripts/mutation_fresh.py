"""pytest plugin for mutation runs (scripts/mutation.sh loads it with `-p mutation_fresh`).

mutmut forks each mutant's test run from a process that already ran the clean tests, so results
cached at module level there (functools caches: `synthetic_model`, a test's cached forward, the
models' resolvers, vllm-static's tap subclasses) were computed by the unmutated code and would
hide a mutant. Every such cache in our packages and test modules is emptied when a pytest session
starts."""

from __future__ import annotations

import sys
from typing import Any

_OURS = ("ie_", "test_", "eager_support", "vllm_support", "op_references")
# Module-level memos that are not functools caches: (module, attribute).
_MEMOS = (("ie_static.taps", "_SWAPPED"),)  # tap subclasses, made once per module class


def _clear(module: Any) -> None:
    for value in list(vars(module).values()):
        clear = getattr(value, "cache_clear", None)
        if callable(clear) and getattr(value, "__module__", None) == module.__name__:
            clear()


def pytest_sessionstart(session: Any) -> None:
    del session
    for name, module in list(sys.modules.items()):
        if module is not None and name.split(".")[0].startswith(_OURS):
            _clear(module)
    for name, attribute in _MEMOS:
        memo = getattr(sys.modules.get(name), attribute, None)
        if memo is not None:
            memo.clear()
