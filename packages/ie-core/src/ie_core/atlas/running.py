"""`atlas`: one pass of a corpus through a model and a dictionary into a resumable atlas folder.

Windows come from harvest's corpus readers and `make_windows` (same packing and BOS options);
each window's statistics come from the reducer `AtlasTopK` (every backend: encoded and reduced
in the worker where the backend reduces there, else captured and reduced on the host), so only
per-feature top-k, counts, sums, histograms and band samples cross, never `[tokens, d_sae]`;
they merge into the streaming `AtlasState`. The state is checkpointed with the windows it has seen; a rerun
resumes from the checkpoint after checking the corpus still yields the same tokens.

Rows at an added BOS (document -1) are not counted: they are not corpus text. Window `i` of the
corpus is sequence `i` (so shards taking every n-th window keep corpus-wide sequence ids and
merge into what one run gives).
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ie_core.atlas.contexts import context_tensors, logit_tensors
from ie_core.atlas.dictionary import check_finite, describe
from ie_core.atlas.errors import AtlasError
from ie_core.atlas.partial import partial_state
from ie_core.atlas.state import AtlasState, Binning, merge_all
from ie_core.atlas.storage import (
    CONTEXTS,
    LOGITS,
    AtlasManifest,
    Checkpoint,
    check_folder,
    check_same_spec,
    read_checkpoint,
    read_manifest,
    write_checkpoint,
    write_manifest,
    write_tensors,
)
from ie_core.experiments.features import check_dictionary
from ie_core.experiments.saes import SAE
from ie_core.harvest.corpus import checked_documents, describe_files, iter_file_documents
from ie_core.harvest.errors import CorpusError
from ie_core.harvest.progress_line import ProgressLine
from ie_core.harvest.spec import HarvestOptions, build_spec
from ie_core.harvest.storage import prepare_folder
from ie_core.harvest.windows import Window, make_windows
from ie_core.reduce import AtlasTopK, Reduction
from ie_core.runner import run
from ie_core.sync import unwrap

__all__ = ["AtlasResult", "atlas"]

Windows = Callable[[], Iterator[tuple[int, Window]]]


@dataclass(frozen=True)
class AtlasResult:
    out: Path
    windows: int
    tokens: int
    resumed_windows: int
    seconds: float


def window_source(
    model: Any, opts: HarvestOptions, documents: Iterable[str] | None, shard: tuple[int, int]
) -> Windows:
    """The corpus's windows as (sequence, window), this shard's only, re-readable."""
    kept = list(documents) if documents is not None else None

    def windows() -> Iterator[tuple[int, Window]]:
        docs = checked_documents(kept) if kept is not None else iter_file_documents(
            opts.files, opts.column
        )  # fmt: skip
        every = make_windows(
            docs, model.to_tokens, context=opts.context, bos=opts.bos, packing=opts.packing,
            max_tokens=opts.max_tokens,
        )  # fmt: skip
        return ((i, w) for i, w in enumerate(every) if i % shard[1] == shard[0])

    return windows


def check_corpus(model: Any, opts: HarvestOptions, documents: Iterable[str] | None) -> None:
    """Refuse an empty corpus, and one shorter than a window, before anything is written."""
    seen = 0
    for _, window in window_source(model, opts, documents, (0, 1))():
        body = sum(1 for d in window.documents if d >= 0)
        seen += body
        if seen >= opts.context - (len(window.tokens) - body):
            return
    if seen == 0:
        raise CorpusError("the corpus holds no text (no document has a token); pass a corpus")
    raise CorpusError(
        f"the corpus holds {seen} tokens, fewer than one window of --context {opts.context}; "
        "pass more text or a smaller --context"
    )


def _spec(model: Any, sae: SAE, source: Any, opts: HarvestOptions, files: Any, extra: dict) -> dict:
    spec = build_spec(model, opts, files)
    for dropped in ("points", "widths", "dtype", "shard_tokens"):
        spec.pop(dropped)
    return {**spec, "dictionary": describe(sae, source), **extra}


def _batch_state(
    model: Any, sae: SAE, batch: list[tuple[int, Window]], state: AtlasState
) -> AtlasState:
    """`state` after the batch's corpus rows, each window's statistics reduced where its rows
    live (`AtlasTopK`: in the worker, eager's forward, or the host fallback)."""
    groups: dict[tuple[int, int], list[tuple[int, Window]]] = {}
    for i, w in batch:
        groups.setdefault((len(w.tokens), _head(w)), []).append((i, w))
    b = state.binning
    parts = [state]
    for (_, skip), group in groups.items():
        reducer = AtlasTopK(sae.key, state.k, state.samples, (b.per_octave, b.low, b.high), skip,
                            sae)  # fmt: skip
        got = run(model.reduce([list(w.tokens) for _, w in group],
                               [Reduction(sae.address, reducer, "atlas")]))["atlas"]  # fmt: skip
        for entry, (i, w) in enumerate(group):
            part = partial_state(got, entry, state.k, state.samples, b, sequence=i)
            if part.tokens != len(w.tokens) - skip:
                raise AtlasError(
                    f"window {i}: the reducer read {part.tokens} rows of its "
                    f"{len(w.tokens) - skip}; a request recomputed from inside a forward chunk "
                    "cannot be summed exactly: rerun (the checkpoint resumes) with prefix "
                    "caching off"
                )
            parts.append(part)
    return merge_all(parts)


def _head(window: Window) -> int:
    """The window's added BOS rows: all at its start, never corpus text."""
    head = next((j for j, d in enumerate(window.documents) if d >= 0), len(window.documents))
    if any(d < 0 for d in window.documents[head:]):
        raise AtlasError("a window holds an added BOS after its text; the atlas reads only a "
                         "leading one")  # fmt: skip
    return head


def _resume(
    folder: Path, d_sae: int, top_k: int, samples: int, binning: Binning
) -> tuple[AtlasState, int, str]:
    point = read_checkpoint(folder)
    if point is None:
        return AtlasState.empty(d_sae, top_k, samples, binning), 0, ""
    return point.state, point.windows, point.tokens_sha256


def atlas(
    model: Any, sae: SAE, out: str | Path, *, files: Iterable[str | Path] = (),
    documents: Iterable[str] | None = None, dictionary_source: str | Path = "", top_k: int = 20,
    samples: int = 4, logits: int = 10, shard: tuple[int, int] = (0, 1),
    checkpoint_windows: int = 64, binning: Binning | None = None, command: list[str] | None = None,
    progress: bool | None = None, **options: Any,
) -> AtlasResult:  # fmt: skip
    """Every feature of `sae` over `files` (or `documents`) into `out`; rerun to resume.
    Window options as `harvest`: `column`, `context`, `bos`, `packing`, `max_tokens`,
    `batch_windows`. `shard=(i, n)` takes the corpus's windows i, i + n, i + 2n, ..."""
    model = unwrap(model)
    files = tuple(files)
    if documents is not None and files:
        raise AtlasError("pass data files or documents, not both")
    if not (0 <= shard[0] < shard[1]):
        raise AtlasError(f"shard {shard[0]}/{shard[1]} is not i/n with 0 <= i < n")
    if top_k < 1 or samples < 0 or logits < 0 or checkpoint_windows < 1:
        raise AtlasError("top_k and checkpoint_windows must be >= 1, samples and logits >= 0")
    check_finite(sae)
    check_dictionary(model, sae)
    described = describe_files(files) if documents is None else ()
    documents = list(checked_documents(documents)) if documents is not None else None
    opts = HarvestOptions.make(
        model, (sae.address,), tuple(str(f) for f in files), dtype="float32", **options
    )
    binning = binning or Binning()
    extra = {"top_k": top_k, "samples": samples, "logits": logits, "binning": binning.to_dict(),
             "shard": list(shard), "checkpoint_windows": checkpoint_windows}  # fmt: skip
    folder = Path(out)
    check_folder(folder)
    check_corpus(model, opts, documents)
    spec = _spec(model, sae, dictionary_source or None, opts, described, extra)
    folder = prepare_folder(folder)
    manifest = read_manifest(folder)
    if manifest is not None:
        check_same_spec(folder, manifest.spec, spec)
    else:
        manifest = AtlasManifest(spec, command)
        write_manifest(folder, manifest)
    if manifest.complete:
        return AtlasResult(folder, manifest.info["windows"], manifest.info["tokens"], 0, 0.0)
    windows = window_source(model, opts, documents, shard)
    state, done, digest = _resume(folder, sae.d_sae, top_k, samples, binning)
    began = time.perf_counter()
    state, seen = _pass(model, sae, folder, windows, state, done, digest, opts, checkpoint_windows,
                        progress)  # fmt: skip
    _finish(model, sae, folder, manifest, state, windows, opts, logits, seen)
    return AtlasResult(folder, seen, state.tokens, done, time.perf_counter() - began)


def _pass(
    model: Any, sae: SAE, folder: Path, windows: Windows, state: AtlasState, done: int,
    digest: str, opts: HarvestOptions, every: int, progress: bool | None,
) -> tuple[AtlasState, int]:  # fmt: skip
    running = hashlib.sha256()
    bar = ProgressLine(opts.max_tokens, enabled=progress, already=state.tokens, label="atlas")
    stream = iter(windows())
    first: list[tuple[int, Window]] = []
    for i, window in stream if done else ():
        if i >= done:
            first = [(i, window)]
            break
        running.update(repr(window.tokens).encode())
    if running.hexdigest() != (digest or hashlib.sha256().hexdigest()):
        raise AtlasError(
            f"the corpus no longer yields the tokens of the {done} windows this folder's "
            "checkpoint holds; the data changed since it was written: pass another --out"
        )
    stream = itertools.chain(first, stream)
    seen, since = done, 0
    while batch := list(itertools.islice(stream, opts.batch_windows)):
        tokens = state.tokens
        state = _batch_state(model, sae, batch, state)
        for _, window in batch:
            running.update(repr(window.tokens).encode())
        seen, since = batch[-1][0] + 1, since + len(batch)
        bar.update(state.tokens - tokens)
        if since >= every:
            write_checkpoint(folder, Checkpoint(state, seen, running.hexdigest()))
            since = 0
    write_checkpoint(folder, Checkpoint(state, seen, running.hexdigest()))
    bar.close()
    return state, seen


def _finish(
    model: Any, sae: SAE, folder: Path, manifest: AtlasManifest, state: AtlasState,
    windows: Windows, opts: HarvestOptions, logits: int, seen: int,
) -> None:  # fmt: skip
    contexts, deviation = context_tensors(model, sae, state, windows, opts.batch_windows)
    write_tensors(folder / CONTEXTS, contexts, {})
    note = ""
    if logits:
        tensors, note = logit_tensors(model, sae, logits)
        if tensors:
            write_tensors(folder / LOGITS, tensors, {})
    info = {"windows": seen, "tokens": state.tokens, "recompute_max_abs_diff": deviation}
    write_manifest(folder, manifest.finished(**info, logits_note=note))
