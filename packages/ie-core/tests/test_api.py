"""Free functions, the sync mirror, `steer` and backend dispatch, against a tiny in-test backend."""

from __future__ import annotations

import pytest
from ie_core import Additive, load_model, steer, steer_at
from ie_core.active_steering import with_active
from ie_core.cache import ActivationCache
from ie_core.errors import BackendNotInstalledError
from ie_core.runner import iterate, run


def test_cache_accepts_every_address_form() -> None:
    cache = ActivationCache({"resid_post.3": 1, ("embeddings", None): 2})
    assert cache["resid_post.3"] == cache[("resid_post", 3)] == 1
    assert "embeddings" in cache and "resid_post.4" not in cache
    with pytest.raises(KeyError, match=r"resid_post\.4 was not captured"):
        cache["resid_post.4"]


def test_steer_context_stacks_and_unwinds() -> None:
    model, other = object(), object()
    a = steer_at("resid_post.1", Additive([1.0]))
    b = steer_at("resid_post.2", Additive([2.0]))
    with steer(model, a):  # type: ignore[arg-type]
        with steer(model, b):  # type: ignore[arg-type]
            assert with_active(model, None) == (a, b)  # type: ignore[arg-type]
            assert with_active(other, None) == ()  # type: ignore[arg-type]
        assert with_active(model, b) == (a, b)  # type: ignore[arg-type]
    assert with_active(model, None) == ()  # type: ignore[arg-type]


def test_runner_runs_coroutines_and_async_iterators() -> None:
    async def double(x: int) -> int:
        return 2 * x

    async def count():  # type: ignore[no-untyped-def]
        for i in range(3):
            yield i

    assert run(double(21)) == 42
    assert list(iterate(count())) == [0, 1, 2]


def test_runner_works_in_a_forked_child() -> None:
    """A child forked after the background loop started gets a loop of its own (it inherited the
    loop object, not its thread); an alarm ends the child if it would hang instead."""
    import os
    import signal

    async def triple(x: int) -> int:
        return 3 * x

    assert run(triple(1)) == 3  # the parent's loop is running
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        signal.alarm(30)
        os.write(write, str(run(triple(2))).encode())
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert os.read(read, 16) == b"6" and os.waitstatus_to_exitcode(status) == 0
    assert run(triple(3)) == 9  # the parent's loop is untouched


def test_unknown_backend_is_refused_with_the_known_names() -> None:
    with pytest.raises(BackendNotInstalledError, match=r"unknown backend .tpu.*eager"):
        load_model("ie-synthetic/llama", backend="tpu")


class _Recorder:
    """A tiny in-test backend: records the steering and sampling each call receives."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, object]] = []

    async def capture(self, tokens, addresses, *, steering=None):  # type: ignore[no-untyped-def]
        self.seen.append(("capture", steering))
        return ActivationCache({})

    async def generate(self, tokens, sampling=None, *, steering=None):  # type: ignore[no-untyped-def]
        self.seen.append(("generate", steering))
        from ie_core.protocol import Generation

        return Generation(tuple(tokens), (), "")

    async def generate_stream(self, tokens, sampling=None, *, steering=None):  # type: ignore[no-untyped-def]
        self.seen.append(("generate_stream", steering))
        yield from_stream()


def from_stream():  # type: ignore[no-untyped-def]
    from ie_core.protocol import StreamChunk

    return StreamChunk(1, "a")


def test_sync_mirror_honours_steer_like_the_free_functions() -> None:
    from ie_core import capture, generate
    from ie_core.sync import SyncModel

    model = _Recorder()
    sync = SyncModel(model)  # type: ignore[arg-type]
    a = steer_at("resid_post.1", Additive([1.0]))
    b = steer_at("resid_post.2", Additive([2.0]))
    with steer(model, a):  # type: ignore[arg-type]
        capture(model, [1, 2], ["resid_post.1"])  # type: ignore[arg-type]
        generate(model, [1, 2])  # type: ignore[arg-type]
        sync.capture([1, 2], ["resid_post.1"])
        sync.generate([1, 2])
        list(sync.generate_stream([1, 2]))
        with steer(sync, b):  # steering the mirror steers the model it wraps
            sync.capture([1, 2], ["resid_post.1"])
    assert [s for _, s in model.seen[:5]] == [(a,)] * 5
    assert model.seen[5] == ("capture", (a, b))
    # Negative control: outside the block nothing is steered, on either path.
    model.seen.clear()
    sync.generate([1, 2])
    capture(model, [1, 2], ["resid_post.1"])  # type: ignore[arg-type]
    assert [s for _, s in model.seen] == [(), ()]


def test_sampling_params_keyword_is_the_old_name_of_sampling() -> None:
    from ie_core.protocol import SamplingParams, renamed_sampling

    default, mine = SamplingParams(), SamplingParams(max_new_tokens=3)
    assert renamed_sampling(mine, None, default) is mine
    with pytest.warns(DeprecationWarning, match="sampling="):
        assert renamed_sampling(default, mine, default) is mine
    with pytest.raises(TypeError, match="once"):
        renamed_sampling(SamplingParams(max_new_tokens=2), mine, default)


def test_text_stream_holds_back_a_split_character() -> None:
    from ie_core.text_stream import TextStream

    # Token 1 is the first byte of "é", token 2 completes it.
    pieces = {(1,): "\ufffd", (1, 2): "é", (1, 2, 3): "é!"}
    stream = TextStream(lambda ids: pieces[tuple(ids)])
    assert [stream.push(t) for t in (1, 2, 3)] == ["", "é", "!"]
