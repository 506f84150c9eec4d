"""Engine processes end with their client (ie_vllm.worker.watchdog): a client killed with SIGKILL leaves
no vLLM engine core or worker behind; without the watchdog plugin they outlive it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from ie_vllm.worker.watchdog import CLIENT_PID_ENV, wait_for_exit
from vllm_support import requires_vllm

SCRIPT = Path(__file__).with_name("vllm_orphan_check.py")
MODEL = "ie-synthetic/llama"
WAIT_S = 60.0  # for the engine to stop after its client is killed (it takes a few seconds)
OUTLIVE_S = 15.0  # negative control: alive this long after the client, it is not stopping


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _kill_client_and_watch(env: dict[str, str], wait_s: float) -> tuple[list[int], list[int]]:
    """Start the client, SIGKILL it once its engine is up; the engine pids and those still alive
    `wait_s` later (the survivors are then killed, so the test leaves nothing behind)."""
    client = subprocess.Popen(
        [sys.executable, str(SCRIPT), MODEL], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert client.stdout is not None
        line = ""
        while not line.startswith("PIDS "):
            line = client.stdout.readline()
            assert line or client.poll() is None, "the client exited before its engine started"
        pids = json.loads(line.removeprefix("PIDS "))
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait(30)
    deadline = time.monotonic() + wait_s
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(1)
    left = _alive(pids)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return pids, left


@pytest.mark.slow
@requires_vllm
def test_a_killed_client_leaves_no_engine_process() -> None:
    pids, left = _kill_client_and_watch({**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}, WAIT_S)
    assert pids, "the engine should run in child processes"
    assert left == []


@pytest.mark.slow
@pytest.mark.full  # a fact about vLLM, checked in the long form; it needs an engine of its own
@requires_vllm
def test_without_the_watchdog_the_engine_outlives_its_client() -> None:
    # Negative control: vLLM loads no plugin outside the allowlist, so nothing watches the client.
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_PLUGINS": "none-allowed"}
    pids, left = _kill_client_and_watch(env, OUTLIVE_S)
    assert pids and left, "without the watchdog the engine core should have outlived its client"


def test_wait_for_exit_returns_when_the_process_ends() -> None:
    """It returns only once the process has ended (it is then reapable with its exit code); a
    hang is pytest's timeout, not a timed assertion."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    assert sleeper.poll() is None  # negative control: it is running when the wait starts
    wait_for_exit(sleeper.pid)
    assert sleeper.poll() == 0  # ended (a zombie until this reaps it), not merely waited on
    wait_for_exit(sleeper.pid)  # a process already gone: returns at once


def test_the_plugin_stops_a_process_whose_client_is_gone() -> None:
    # A stand-in client and an "engine" that runs the plugin, without vLLM: the engine ends with
    # its client; a second one that was not started by an ie-vllm client keeps running.
    client = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    code = "from ie_vllm.worker.watchdog import plugin; import time; plugin(); time.sleep(60)"
    watched = subprocess.Popen(
        [sys.executable, "-c", code], env={**os.environ, CLIENT_PID_ENV: str(client.pid)}
    )
    bystander_env = {k: v for k, v in os.environ.items() if k != CLIENT_PID_ENV}
    bystander = subprocess.Popen([sys.executable, "-c", code], env=bystander_env)
    try:
        time.sleep(2)  # both have started their plugin
        client.kill()
        client.wait(5)
        assert watched.wait(30) != 0
        assert bystander.poll() is None
    finally:
        for p in (client, watched, bystander):
            if p.poll() is None:
                p.kill()
                p.wait(5)
