"""pytest plugin for mutation runs (scripts/mutation.sh loads it with `-p mutation_fresh`).

mutmut forks each mutant's test run from a process that already ran the clean tests, so results
cached at module level there (functools caches: `synthetic_model`, a test's cached forward, the
models' resolvers, vllm-static's tap subclasses) were computed by the unmutated code and would
hide a mutant. Every such cache in our packages and test modules is emptied when a pytest session
starts.

mutmut also runs a mutant only against the tests that called the mutated function in its clean
stats run. A memo shared between tests hides a call from every test after the first (the first
test to resolve `attn_probs.1` on a cached model records the resolver call; a later test that
checks the value of attn_probs hits the memo and is never run against the mutant). So before each
test the memos of test modules (a test's cached forward) and the eager resolver's per-model memos
are emptied too; the loaded models themselves (`synthetic_model`) stay, as loading is slow and a
mutant of load-time code still fails the first test that loads."""

from __future__ import annotations

import sys
import weakref
from typing import Any

_OURS = ("ie_", "test_", "eager_support", "vllm_support", "op_references")
# Module-level memos that are not functools caches: (module, attribute).
_MEMOS = (("ie_static.taps", "_SWAPPED"),)  # tap subclasses, made once per module class


def _clear(module: Any) -> None:
    for value in list(vars(module).values()):
        clear = getattr(value, "cache_clear", None)
        if callable(clear) and getattr(value, "__module__", None) == module.__name__:
            clear()


# Per-test memos: functools caches of these test modules, and these instance attributes (dicts)
# of every live instance of these classes.
_TEST_MODULES = ("test_", "op_references")
_INSTANCE_MEMOS = (("ie_eager.resolve", "Resolver", ("_cache", "_router_orders")),)
_LIVE: dict[str, weakref.WeakSet[Any]] = {}


def _track_instances() -> None:
    """Wrap each memo-holding class's __init__ so its instances can be found and emptied."""
    for module_name, class_name, _ in _INSTANCE_MEMOS:
        cls = getattr(sys.modules.get(module_name), class_name, None)
        if cls is None or getattr(cls, "_mutation_fresh_tracked", False):
            continue
        live = _LIVE.setdefault(f"{module_name}.{class_name}", weakref.WeakSet())
        init = cls.__init__

        def tracked_init(
            self: Any, *args: Any, _init: Any = init, _live: Any = live, **kw: Any
        ) -> None:
            _init(self, *args, **kw)
            _live.add(self)

        cls.__init__ = tracked_init
        cls._mutation_fresh_tracked = True


def pytest_collection_finish(session: Any) -> None:
    del session
    _track_instances()  # the test modules have imported the packages by now


def pytest_runtest_setup(item: Any) -> None:
    del item
    _track_instances()
    for name, module in list(sys.modules.items()):
        if module is not None and name.split(".")[-1].startswith(_TEST_MODULES):
            _clear(module)
    for module_name, class_name, attributes in _INSTANCE_MEMOS:
        for instance in list(_LIVE.get(f"{module_name}.{class_name}", ())):
            for attribute in attributes:
                getattr(instance, attribute).clear()


def pytest_sessionstart(session: Any) -> None:
    del session
    for name, module in list(sys.modules.items()):
        if module is not None and name.split(".")[0].startswith(_OURS):
            _clear(module)
    for name, attribute in _MEMOS:
        memo = getattr(sys.modules.get(name), attribute, None)
        if memo is not None:
            memo.clear()
