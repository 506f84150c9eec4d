"""The grid: one subprocess per model (its variants interleaved, see `ie_bench.group`) or, with
`separate`, one per cell; a memory gate and an optional quiet-load wait before each, a time cap.

A cell that crashes or overruns is recorded as an `error` cell with the tail of its log, and the
sweep moves on: one wedged engine must not cost the rest of the grid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from ie_core.progress import progress_enabled
from tqdm import tqdm

from ie_bench.cell import now, skeleton
from ie_bench.cells import cell_path, read_cell, write_cell
from ie_bench.spec import WORKLOADS, ModelSpec, Profile, VariantSpec, one_engine_at_a_time

GIB = 1024**3
LOG_TAIL_CHARS = 3000


@dataclass(frozen=True)
class CellRun:
    model: ModelSpec
    variant: VariantSpec
    path: Path
    status: str
    seconds: float


def wait_for_memory(min_free_gib: float, max_wait_s: float = 300.0, poll_s: float = 2.0) -> float:
    """Block until `min_free_gib` is available (the last cell's workers may still be exiting).

    Returns the GiB available when it stopped waiting; gives up after `max_wait_s`, since the cell
    then records what it had and fails on its own if that is not enough.
    """
    deadline = time.monotonic() + max_wait_s
    while True:
        free = psutil.virtual_memory().available / GIB
        if free >= min_free_gib or time.monotonic() >= deadline:
            return free
        time.sleep(poll_s)


def wait_for_quiet(max_load: float | None, max_wait_s: float, poll_s: float = 5.0) -> float:
    """Block until the 1-minute load average is at most `max_load` (other users of the machine
    move timings); gives up after `max_wait_s`. Returns the load average it started the cell at."""
    deadline = time.monotonic() + max_wait_s
    while True:
        load = os.getloadavg()[0]
        if max_load is None or load <= max_load or time.monotonic() >= deadline:
            return load
        time.sleep(poll_s)


def vllm_binding(log: Path) -> list[str]:
    """vLLM's report of which cores its CPU workers' OpenMP threads were bound to, from the log."""
    lines = _tail_lines(log)
    return [
        ln.split("INFO", 1)[-1].strip()
        for ln in lines
        if "core ids=" in ln or "reserved_cpus=" in ln
    ]


def _tail_lines(log: Path) -> list[str]:
    try:
        return log.read_text(errors="replace").splitlines()
    except OSError:
        return []


def _kill_group(pgid: int) -> None:
    """End every process the cell started (vLLM workers included), politely and then not."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        time.sleep(3)


def cell_command(
    model: ModelSpec, variant: VariantSpec, profile: Profile, out: Path, workloads: list[str] | None
) -> list[str]:
    cmd = [sys.executable, "-m", "ie_bench", "cell", "--model", model.model_id]
    cmd += ["--variant", variant.key, "--profile", profile.name, "--out", str(out)]
    if workloads:
        cmd += ["--workloads", ",".join(workloads)]
    return cmd


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    except OSError:
        return ""


def _record_failure(
    path: Path,
    model: ModelSpec,
    variant: VariantSpec,
    profile: Profile,
    command: list[str],
    workloads: list[str],
    kind: str,
    message: str,
    log: Path,
) -> dict[str, Any]:
    """Close a cell the process did not finish: keep what it measured, mark the rest not run."""
    try:
        cell = read_cell(path)
    except (OSError, ValueError):
        cell = skeleton(model, variant, profile, command)
    if cell["load"].get("load_s") is None:
        message += " while loading the model (engine start-up)"
    cell["error"] = {"type": kind, "message": message, "log_tail": _tail(log)}
    for name in workloads:
        cell["workloads"].setdefault(
            name,
            {
                "status": "error",
                "metrics": {},
                "samples": {},
                "detail": {"message": f"not run: {message}"},
            },
        )
    cell["status"] = "error"
    cell["finished_at"] = now()
    write_cell(path, cell)
    return cell


def _spawn(command: list[str], log: Path, limit: float) -> int | None:
    """Run `command` in its own session with output to `log`; None when it overran `limit`."""
    with log.open("w") as fh:
        proc = subprocess.Popen(
            command, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=limit)
        except BaseException as exc:
            # Interrupted or overran: the cell's engine must not outlive the sweep.
            _kill_group(proc.pid)
            proc.wait()
            wait_group_gone(proc.pid)
            if not isinstance(exc, subprocess.TimeoutExpired):
                raise
            return None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers left in the cell's session
    wait_group_gone(proc.pid)
    return rc


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`: a zombie holds no memory."""
    alive = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return alive


def wait_group_gone(pgid: int, max_wait_s: float = 30.0, poll_s: float = 0.2) -> bool:
    """Wait until the cell's process group has exited, so the next cell's engine starts on a
    device the last one released (a killed worker frees its GPU memory only once it is gone)."""
    deadline = time.monotonic() + max_wait_s
    while group_members(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def _close_cell(
    model: ModelSpec,
    variant: VariantSpec,
    profile: Profile,
    path: Path,
    command: list[str],
    names: list[str],
    rc: int | None,
    limit: float,
    log: Path,
) -> str:
    """The cell's final status; a cell its process did not finish is closed as an error here."""
    if rc is None:
        _record_failure(
            path, model, variant, profile, command, names, "Timeout",
            f"cell exceeded its {limit:.0f} s cap and was killed", log,
        )  # fmt: skip
        return "error"
    try:
        status = read_cell(path)["status"]
    except (OSError, ValueError):
        status = "missing"
    binding = vllm_binding(log)
    if binding and status not in ("running", "missing"):
        cell = read_cell(path)
        cell["environment"]["vllm_omp_binding"] = binding
        write_cell(path, cell)
    # A finished cell records its own failure (exit code 1 included); only an unfinished one needs ours.
    if status in ("running", "missing"):
        _record_failure(
            path, model, variant, profile, command, names, "CellExit",
            f"cell process exited with code {rc} before finishing", log,
        )  # fmt: skip
        status = "error"
    return status


def run_one(
    model: ModelSpec,
    variant: VariantSpec,
    profile: Profile,
    cells_dir: Path,
    log_dir: Path,
    workloads: list[str] | None = None,
    timeout_s: float | None = None,
) -> CellRun:
    path = cell_path(cells_dir, profile.name, model.key, variant.key)
    log = log_dir / f"{profile.name}__{path.stem}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    command = cell_command(model, variant, profile, path, workloads)
    limit = timeout_s or profile.cell_timeout_s
    names = workloads or [w.key for w in WORKLOADS]
    start = time.monotonic()
    rc = _spawn(command, log, limit)
    status = _close_cell(model, variant, profile, path, command, names, rc, limit, log)
    return CellRun(model, variant, path, status, time.monotonic() - start)


def group_command(
    model: ModelSpec,
    variants: list[VariantSpec],
    profile: Profile,
    cells_dir: Path,
    workloads: list[str] | None,
) -> list[str]:
    cmd = [sys.executable, "-m", "ie_bench", "group", "--model", model.model_id]
    cmd += ["--variants", ",".join(v.key for v in variants), "--profile", profile.name]
    cmd += ["--cells-dir", str(cells_dir)]
    if workloads:
        cmd += ["--workloads", ",".join(workloads)]
    return cmd


def run_group_process(
    model: ModelSpec,
    variants: list[VariantSpec],
    profile: Profile,
    cells_dir: Path,
    log_dir: Path,
    workloads: list[str] | None = None,
    timeout_s: float | None = None,
) -> list[CellRun]:
    """One model's variants interleaved in one subprocess (`ie bench group`); a cap per variant."""
    paths = [cell_path(cells_dir, profile.name, model.key, v.key) for v in variants]
    log = log_dir / f"{profile.name}__{model.key}__interleaved.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    for path in paths:
        path.unlink(missing_ok=True)
    command = group_command(model, variants, profile, cells_dir, workloads)
    limit = (timeout_s or profile.cell_timeout_s) * len(variants)
    names = workloads or [w.key for w in WORKLOADS]
    start = time.monotonic()
    rc = _spawn(command, log, limit)
    seconds = time.monotonic() - start
    runs = []
    for v, path in zip(variants, paths, strict=True):
        status = _close_cell(model, v, profile, path, command, names, rc, limit, log)
        runs.append(CellRun(model, v, path, status, seconds))
    return runs


def _wait(
    profile: Profile, quiet_load: float | None, quiet_wait_s: float, bar: Any, what: str
) -> None:
    wait_for_memory(profile.min_free_gib)
    if quiet_load is not None:
        bar.set_postfix_str(f"{what}: waiting for load <= {quiet_load}")
        wait_for_quiet(quiet_load, quiet_wait_s)
    bar.set_postfix_str(what)


def dropped_workloads(
    cells_dir: Path,
    profile: Profile,
    models: list[ModelSpec],
    variants: list[VariantSpec],
    workloads: list[str] | None,
) -> dict[Path, list[str]]:
    """Existing cells whose other workloads a `workloads`-restricted run would drop.

    A run rewrites whole cells, so that every figure in one cell was measured under one set of
    conditions; rewriting a cell with fewer workloads would silently lose the rest.
    """
    if not workloads:
        return {}
    lost: dict[Path, list[str]] = {}
    for model in models:
        for variant in variants:
            path = cell_path(cells_dir, profile.name, model.key, variant.key)
            if path.is_file():
                others = sorted(set(read_cell(path).get("workloads", {})) - set(workloads))
                if others:
                    lost[path] = others
    return lost


def schedule(
    models: list[ModelSpec], variants: list[VariantSpec], profile: Profile, separate: bool
) -> list[tuple[ModelSpec, list[VariantSpec]]]:
    """The sweep's processes in order, each a model and the variants it loads together.

    One process per model (its variants interleaved) unless `separate` or the profile holds one
    engine at a time (`one_engine_at_a_time`: CUDA); then one per cell, and the next process
    starts only after the previous one's whole process group has exited (`_spawn`).
    """
    if separate or one_engine_at_a_time(profile):
        return [(m, [v]) for m in models for v in variants]
    return [(m, list(variants)) for m in models]


def run_sweep(
    models: list[ModelSpec],
    variants: list[VariantSpec],
    profile: Profile,
    cells_dir: Path,
    log_dir: Path,
    workloads: list[str] | None = None,
    timeout_s: float | None = None,
    on_cell: Callable[[CellRun], None] | None = None,
    quiet_load: float | None = None,
    quiet_wait_s: float = 600.0,
    separate: bool = False,
) -> list[CellRun]:
    """Every (model, variant) cell: interleaved per model, or with `separate` one process each."""
    runs: list[CellRun] = []
    separate = separate or one_engine_at_a_time(profile)
    grid = schedule(models, variants, profile, separate)
    # In a log the bar is off; the one line per finished cell below is printed either way.
    unit = "cell" if separate else "model"
    bar = tqdm(grid, desc=f"ie bench ({profile.name})", unit=unit, disable=not progress_enabled())
    for model, group in bar:
        what = f"{model.key} / {','.join(v.key for v in group)}"
        _wait(profile, quiet_load, quiet_wait_s, bar, what)
        if separate:
            done = [run_one(model, group[0], profile, cells_dir, log_dir, workloads, timeout_s)]
        else:
            done = run_group_process(
                model, group, profile, cells_dir, log_dir, workloads, timeout_s
            )
        for run in done:
            runs.append(run)
            bar.write(
                f"{model.key} / {run.variant.key}: {run.status} in {run.seconds:.0f} s -> {run.path}"
            )
            if on_cell:
                on_cell(run)
    return runs
