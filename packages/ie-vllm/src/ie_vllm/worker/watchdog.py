"""Engine processes that end with their client.

vLLM's engine core and its workers are children of the process that started them, but they do
not die with it: a client killed by a signal (or a notebook kernel restarted mid-compile) leaves
them running, holding memory and busy-looping on their queues. ie-vllm records the client's pid
in `CLIENT_PID_ENV` before it starts an engine; vLLM loads `plugin` (a `vllm.general_plugins`
entry point) in the engine core and in every worker, where it watches that pid and stops the
process once the client is gone.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time

CLIENT_PID_ENV = "IE_VLLM_CLIENT_PID"
POLL_S = 1.0  # where pidfd is unavailable: how often to look for the client
GRACE_S = 10.0  # after SIGTERM, how long vLLM's own shutdown may take before a hard exit


def mark_client() -> None:
    """Name this process as the client of the engines it starts from now on."""
    os.environ[CLIENT_PID_ENV] = str(os.getpid())


def wait_for_exit(pid: int) -> None:
    """Return once process `pid` has exited (at once if it already has)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except OSError:  # no pidfd (old kernel, other OS): poll
        while _alive(pid):
            time.sleep(POLL_S)
        return
    try:
        select.select([fd], [], [])  # a pidfd turns readable when its process exits
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # PermissionError: it exists, owned by someone else
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _stop_when_gone(pid: int) -> None:
    wait_for_exit(pid)
    os.kill(os.getpid(), signal.SIGTERM)  # vLLM's handlers shut the engine down
    time.sleep(GRACE_S)
    os._exit(1)


def plugin() -> None:
    """vLLM general plugin: in an engine process of an ie-vllm client, watch that client."""
    value = os.environ.get(CLIENT_PID_ENV, "")
    if not value.isdigit() or int(value) == os.getpid():
        return  # not started by ie-vllm, or this is the client itself
    threading.Thread(
        target=_stop_when_gone, args=(int(value),), name="ie-client-watchdog", daemon=True
    ).start()


__all__ = ["CLIENT_PID_ENV", "mark_client", "plugin", "wait_for_exit"]
