"""`ie harvest` on a real full disk: a small tmpfs mounted by the test (root only; skipped with
the reason elsewhere). Running out of room is named, loses no complete shard, leaves no partial
file, and the same command resumes to the dataset an uninterrupted run writes."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from eager_harvest_support import OPTIONS, POINTS, write_corpus
from eager_support import synthetic_model
from ie_core.harvest import OutputFolderError, harvest, open_harvest

SMALL = {**OPTIONS, "max_tokens": 600}  # about 8 shards of ~75 kB
DISK_BYTES = 256 * 1024  # room for about 3 of them


@pytest.fixture(scope="module")
def model() -> Any:
    return synthetic_model("llama")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    write_corpus(path)
    return path


@pytest.fixture(scope="module")
def reference(model: Any, corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reference") / "out"
    harvest(model, out, POINTS, files=[corpus], progress=False, **SMALL)
    return out


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip() or 'not root'})")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _rows(folder: Path) -> dict[str, torch.Tensor]:
    shards = list(open_harvest(folder).iter_shards())
    return {k: torch.cat([s[k] for s in shards]) for k in shards[0]}


def _assert_prefix_of(folder: Path, reference: Path) -> int:
    """Every complete shard in `folder` equals the reference's shard of the same index."""
    got, want = open_harvest(folder), open_harvest(reference)
    for mine, theirs in zip(got.iter_shards(), want.iter_shards(), strict=False):
        for key, value in mine.items():
            assert torch.equal(value, theirs[key]), key
    return len(got.manifest.shards)


def _no_partial_files(folder: Path) -> None:
    listed = {s.file for s in open_harvest(folder).manifest.shards}
    on_disk = {p.name for p in folder.glob("shard-*")}
    assert on_disk == listed and not list(folder.glob(".*.tmp"))


def _resume_elsewhere(
    model: Any, corpus: Path, folder: Path, tmp_path: Path, reference: Path
) -> None:
    roomy = tmp_path / "roomy"
    shutil.copytree(folder, roomy)
    again = harvest(model, roomy, POINTS, files=[corpus], progress=False, **SMALL)
    assert again.resumed_shards >= 1
    got, want = _rows(roomy), _rows(reference)
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key


def test_the_free_space_check_stops_before_a_shard_that_cannot_fit(
    model: Any, corpus: Path, reference: Path, small_disk: Path, tmp_path: Path
) -> None:
    out = small_disk / "out"
    with pytest.raises(OutputFolderError, match="MB free, the next shard needs about"):
        harvest(model, out, POINTS, files=[corpus], progress=False, **SMALL)
    kept = _assert_prefix_of(out, reference)
    assert kept >= 1
    _no_partial_files(out)
    _resume_elsewhere(model, corpus, out, tmp_path, reference)


def test_a_disk_that_fills_during_a_write_is_named_and_loses_nothing(
    model: Any,
    corpus: Path,
    reference: Path,
    small_disk: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another writer takes the free space while a shard is half written (the write pauses
    halfway under IE_HARVEST_WRITE_PAUSE_S): the real ENOSPC is reported as a full disk."""
    out = small_disk / "out"
    monkeypatch.setenv("IE_HARVEST_WRITE_PAUSE_S", "0.5")
    filler = small_disk / "other-writer"

    def fill_when_a_shard_is_half_written() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            # After one complete shard, so there is something the failure must not lose.
            if list(out.glob("shard-*")) and list(out.glob(".shard-*.tmp")):
                fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
                with contextlib.suppress(OSError):  # ENOSPC: the disk is now full
                    while True:
                        os.write(fd, b"\0" * 4096)
                os.close(fd)
                return
            time.sleep(0.01)

    thread = threading.Thread(target=fill_when_a_shard_is_half_written, daemon=True)
    thread.start()
    with pytest.raises(OutputFolderError, match="the disk is full"):
        harvest(model, out, POINTS, files=[corpus], progress=False, **SMALL)
    thread.join(timeout=10)
    filler.unlink()
    assert _assert_prefix_of(out, reference) >= 1
    _no_partial_files(out)
    _resume_elsewhere(model, corpus, out, tmp_path, reference)
