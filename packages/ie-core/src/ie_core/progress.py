"""Progress bars: on when a person watches a terminal, off in logs and CI.

tqdm bars from Hugging Face, transformers and vLLM redraw with carriage returns (vLLM's weight
loader with a newline per step), which floods a log file. `IE_PROGRESS=1` forces bars on,
`IE_PROGRESS=0` off; unset, they follow whether stderr is a terminal (a Jupyter kernel counts as
one: its bars are widgets, not log lines).
"""

from __future__ import annotations

import os
import sys

__all__ = ["PROGRESS_ENV", "progress_enabled", "quiet_third_party_progress"]

PROGRESS_ENV = "IE_PROGRESS"


def progress_enabled() -> bool:
    """True when progress bars should be drawn (`IE_PROGRESS`, else stderr is a terminal)."""
    forced = os.environ.get(PROGRESS_ENV, "").strip().lower()
    if forced in {"1", "true", "yes", "on"}:
        return True
    if forced in {"0", "false", "no", "off"}:
        return False
    if "ipykernel" in sys.modules:
        return True
    stream = sys.stderr
    return bool(stream is not None and hasattr(stream, "isatty") and stream.isatty())


def quiet_third_party_progress() -> bool:
    """Turn third-party bars off when `progress_enabled()` is False; returns whether it did.

    Sets `HF_HUB_DISABLE_PROGRESS_BARS` and `TQDM_DISABLE` (both read when their library is
    imported, and inherited by engine worker processes) unless the user set them, and tells an
    already imported transformers / huggingface_hub directly. Call it before loading anything.
    """
    if progress_enabled():
        return False
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    return True
