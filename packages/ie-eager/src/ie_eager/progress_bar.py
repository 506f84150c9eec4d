"""A progress bar over eager generation: 150 tokens on a CPU is ~10 s that would pass in silence.

Drawn only where `ie_core.progress.progress_enabled()` says a person watches (a terminal, Jupyter,
or `IE_PROGRESS=1`), and only for long generations; the bar goes to stderr and closes at EOS.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

from ie_core.progress import progress_enabled

T = TypeVar("T")

MIN_TOKENS = 32  # shorter generations finish before a bar would tell anyone anything


def generation_bar(tokens: Iterator[T], total: int) -> Iterator[T]:
    """Yield `tokens` (or decode steps) unchanged, advancing a bar of `total` generated tokens."""
    if total < MIN_TOKENS or not progress_enabled():
        yield from tokens
        return
    from tqdm.auto import tqdm

    # disable=False is explicit: TQDM_DISABLE (set for third-party bars in logs) must not win.
    with tqdm(total=total, desc="generating", unit="tok", leave=False, disable=False) as bar:
        for token in tokens:
            bar.update(1)
            yield token
