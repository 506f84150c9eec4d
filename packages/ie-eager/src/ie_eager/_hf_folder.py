"""Writing plain HF folders into the cache: atomically, and readable by transformers 4.x and 5.x."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def materialize(final: Path, write: Callable[[Path], None]) -> Path:
    """Return `final`, first filling it by calling `write(tmp)` on a fresh sibling temp folder.

    The rename is atomic on one file system, so a folder that exists is complete; when another
    process wins the race, its folder is kept and ours is thrown away (both hold the same bytes).
    """
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a cache is read by other tools
        write(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def name_tokenizer_class(folder: Path) -> None:
    """Name the tokenizer class `PreTrainedTokenizerFast`, which transformers 4.x and 5.x both load.

    transformers 5 writes `TokenizersBackend`, a name 4.x does not know.
    """
    path = folder / "tokenizer_config.json"
    settings = json.loads(path.read_text())
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
