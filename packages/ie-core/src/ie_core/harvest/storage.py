"""Writing a harvest folder safely: whole files only (write, fsync, rename), a writability probe,
and a free-space check before a shard's work starts."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import time
import uuid
from pathlib import Path

from ie_core.harvest.errors import OutputFolderError

__all__ = ["PAUSE_ENV", "check_free_space", "prepare_folder", "write_atomic"]

# Test seam for the kill test: seconds to pause halfway through writing a shard's bytes, so a
# SIGKILL can land while a file is half written. Unset in normal use.
PAUSE_ENV = "IE_HARVEST_WRITE_PAUSE_S"
SPACE_MARGIN = 1.05


def prepare_folder(folder: Path) -> Path:
    """Create `folder` and prove a file can be written there, before any model work."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".probe-{uuid.uuid4().hex}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise OutputFolderError(
            f"cannot write the output folder {str(folder)!r} ({exc.strerror or exc}); "
            "pass a folder you can write with --out"
        ) from None
    return folder


def check_free_space(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if free < needed * SPACE_MARGIN:
        raise OutputFolderError(
            f"{folder} has {free / 1e6:.1f} MB free, the next shard needs about "
            f"{needed / 1e6:.1f} MB; free space or pass another --out (the complete shards are kept, "
            "rerunning the same command resumes)"
        )


def _write_bytes(path: Path, data: bytes) -> None:
    pause = float(os.environ.get(PAUSE_ENV, "0") or 0)
    with path.open("wb") as handle:
        if pause > 0:
            handle.write(data[: len(data) // 2])
            handle.flush()
            time.sleep(pause)
            handle.write(data[len(data) // 2 :])
        else:
            handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to a hidden temporary file beside `path`, then rename it over `path`: a kill
    leaves either the old file or the new one, never part of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        _write_bytes(tmp, data)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        what = "the disk is full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        raise OutputFolderError(
            f"writing {path} failed: {what}; the complete shards are kept, free space (or fix the "
            "folder) and rerun the same command to resume"
        ) from None
    with contextlib.suppress(OSError):
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
