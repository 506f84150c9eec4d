"""ie-vllm's readers and writers of hook arguments and outputs (`ie_vllm.worker.access`), no engine:
each reads the point's `[tokens, width]` rows out of a hook's tensors exactly, against an index
computation written here, and each writer hands torch back the same structure with only the
point's entries replaced (every other argument, tuple item and column bit-identical)."""

from __future__ import annotations

import pytest
import torch
from ie_vllm.worker.access import (
    BranchSum,
    column_slice,
    head_slice,
    post_first,
    post_out,
    post_sum,
    pre_arg,
    pre_sum,
    qkv_arg,
    scaled_out,
)

G = torch.Generator().manual_seed(0)


def _t(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=G)


def test_pre_arg_reads_and_writes_the_named_input_positionally_or_by_keyword() -> None:
    x, other = _t(5, 2, 3), _t(5, 4)  # [tokens, heads, dim] is read flat
    read, write = pre_arg("hidden", 1)
    assert torch.equal(read((other, x), {}, None), x.reshape(5, 6))
    assert torch.equal(read((other,), {"hidden": x}, None), x.reshape(5, 6))
    new = _t(5, 6)
    args, kwargs = write((other, x, other), {"k": 1}, None, new)
    assert len(args) == 3 and args[0] is other and args[2] is other and kwargs == {"k": 1}
    assert args[1].shape == x.shape and torch.equal(args[1].reshape(5, 6), new)
    args, kwargs = write((other,), {"hidden": x, "k": 1}, None, new)
    assert (
        args == (other,)
        and kwargs["k"] == 1
        and torch.equal(kwargs["hidden"], new.reshape(x.shape))
    )
    # The Transformers backend's [1, tokens, width]: the batch of one is dropped.
    read_b, _ = pre_arg("hidden", 0, batched=True)
    y = _t(1, 5, 4)
    assert torch.equal(read_b((y,), {}, None), y[0])
    assert pre_arg("hidden", 0)[0]((y,), {}, None).shape == (1, 20)  # unbatched: [1, 20]


def test_post_out_takes_a_tensor_or_the_first_of_an_output_and_bias_tuple() -> None:
    out, bias = _t(4, 3), _t(3)
    read, write = post_out()
    assert torch.equal(read((), {}, out), out)
    assert torch.equal(read((), {}, (out, bias)), out)
    new = _t(4, 3)
    assert torch.equal(write((), {}, out, new), new)
    pair = write((), {}, (out, bias), new)
    assert isinstance(pair, tuple) and len(pair) == 2
    assert torch.equal(pair[0], new) and pair[1] is bias
    batched = _t(1, 4, 3)
    assert torch.equal(post_out(batched=True)[0]((), {}, batched), batched[0])
    back = post_out(batched=True)[1]((), {}, batched, new)
    assert back.shape == (1, 4, 3) and torch.equal(back[0], new)


def test_scaled_out_multiplies_the_read_and_divides_the_write() -> None:
    out = _t(4, 3)
    read, write = scaled_out(2.5)
    torch.testing.assert_close(read((), {}, out), out * 2.5, rtol=0, atol=0)
    new = _t(4, 3)
    got = write((), {}, (out, "aux"), new)
    assert got[1] == "aux"
    torch.testing.assert_close(got[0] * 2.5, new, rtol=1e-6, atol=1e-6)
    # Negative control: a writer that forgot the scale would not give back `new` when read.
    assert not torch.allclose(read((), {}, got[0]) / 2.5, new)
    assert torch.allclose(read((), {}, got[0]), new, rtol=1e-6, atol=1e-6)
    assert torch.equal(scaled_out(2.0, batched=True)[0]((), {}, out[None]), out * 2.0)


def test_pre_sum_reads_hidden_plus_residual_and_writes_the_sum_with_a_zero_residual() -> None:
    h, r, pos = _t(4, 3), _t(4, 3), torch.arange(4)
    read, write = pre_sum("hidden", 1, "residual", 2)
    torch.testing.assert_close(read((pos, h, r), {}, None), h + r, rtol=0, atol=0)
    torch.testing.assert_close(read((pos,), {"hidden": h, "residual": r}, None), h + r)
    # The first layer gets no residual (None or absent): the stream is the hidden state alone.
    assert read((pos, h), {}, None) is h
    assert read((pos, h, None), {}, None) is h
    new = _t(4, 3)
    args, kwargs = write((pos, h, r), {}, None, new)
    assert args[0] is pos and args[1] is new and torch.equal(args[2], torch.zeros_like(r))
    assert kwargs == {}
    args, kwargs = write((pos,), {"hidden": h, "residual": r}, None, new)
    assert kwargs["hidden"] is new and torch.equal(kwargs["residual"], torch.zeros(4, 3))
    args, kwargs = write((pos, h), {}, None, new)
    assert len(args) == 2 and args[1] is new
    # What the next fused add-norm sees: hidden + residual is exactly the written stream.
    args, _ = write((pos, h, r), {}, None, new)
    assert torch.equal(read(args, {}, None), new)


def test_post_sum_and_post_first_on_layer_outputs() -> None:
    h, r = _t(4, 3), _t(4, 3)
    read, write = post_sum()
    assert torch.equal(read((), {}, (h, r)), h + r)
    assert read((), {}, h) is h
    new = _t(4, 3)
    got = write((), {}, (h, r), new)
    assert got[0] is new and torch.equal(got[1], torch.zeros_like(r))
    assert write((), {}, h, new) is new
    read1, write1 = post_first()
    assert read1((), {}, (h, r)) is h and read1((), {}, h) is h
    got = write1((), {}, (h, r, "x"), new)
    assert got[0] is new and got[1] is r and got[2] == "x"
    assert write1((), {}, h, new) is new


@pytest.mark.parametrize("batched", [False, True])
def test_column_slice_reads_and_writes_only_its_columns(batched: bool) -> None:
    out = _t(1, 4, 10) if batched else _t(4, 10)
    read, write = column_slice(3, 7, batched)
    flat = out.reshape(-1, 10)
    want = torch.stack([torch.stack([flat[t, c] for c in range(3, 7)]) for t in range(4)])
    assert torch.equal(read((), {}, (out, None)), want)
    new = _t(4, 4)
    got = write((), {}, (out, "bias"), new)
    assert got[1] == "bias" and got[0].shape == out.shape
    g = got[0].reshape(-1, 10)
    assert torch.equal(g[:, 3:7], new)
    assert torch.equal(g[:, :3], flat[:, :3]) and torch.equal(g[:, 7:], flat[:, 7:])
    assert torch.equal(out.reshape(-1, 10), flat)  # the module's own output is not modified
    plain = write((), {}, out, new)
    assert isinstance(plain, torch.Tensor) and torch.equal(plain, got[0])


def test_head_slice_is_the_interleaved_value_of_each_head() -> None:
    """GPT-NeoX's fused [q, k, v] per head: the value of head g is columns
    `(g * per + index) * head_dim ...` of the output, heads side by side."""
    groups, per, index, hd = 3, 3, 2, 4
    out = _t(5, groups * per * hd)
    read, write = head_slice(groups, per, index, hd)
    cols = [(g * per + index) * hd + d for g in range(groups) for d in range(hd)]
    want = out[:, cols]
    assert torch.equal(read((), {}, out), want)
    # Negative control: the contiguous last third (q|k|v layout) is another tensor.
    assert not torch.equal(read((), {}, out), out[:, 2 * groups * hd :])
    new = _t(5, groups * hd)
    got = write((), {}, (out, None), new)[0]
    assert torch.equal(got[:, cols], new)
    rest = [c for c in range(out.shape[1]) if c not in cols]
    assert torch.equal(got[:, rest], out[:, rest])
    batched = head_slice(groups, per, index, hd, batched=True)[0]((), {}, out[None])
    assert torch.equal(batched, want)
    assert torch.equal(write((), {}, out, new), got)


def test_qkv_arg_reads_query_or_key_and_writes_nothing() -> None:
    q, k, v = _t(4, 2, 3), _t(4, 6), _t(4, 6)
    read_q, write_q = qkv_arg(0)
    read_k, _ = qkv_arg(1)
    assert write_q is None
    assert torch.equal(read_q((q, k, v), {}, None), q.reshape(4, 6))
    assert torch.equal(read_k((q, k, v), {}, None), k)
    assert torch.equal(read_q((), {"query": q, "key": k}, None), q.reshape(4, 6))
    assert torch.equal(read_k((), {"query": q, "key": k}, None), k)


def test_defaults_read_multi_dim_rows_flat_per_token() -> None:
    """vLLM's own layers pass `[tokens, ...]`: by default a `[tokens, heads, dim]` output is read
    as `[tokens, heads * dim]` (the batched form would cut it into rows of `dim`)."""
    out = _t(4, 2, 3)
    assert torch.equal(post_out()[0]((), {}, out), out.reshape(4, 6))
    assert torch.equal(scaled_out(2.0)[0]((), {}, out), out.reshape(4, 6) * 2.0)
    assert torch.equal(column_slice(1, 3)[0]((), {}, out), out[..., 1:3].reshape(4, 4))
    fused = _t(4, 2, 12)  # [tokens, 2, groups * per * head_dim] with groups=1, per=3, hd=4
    assert head_slice(1, 3, 2, 4)[0]((), {}, fused).shape == (4, 8)
    # A tensor output (no tuple) is written back as a tensor.
    new = _t(4, 6)
    back = scaled_out(2.0)[1]((), {}, out, new)
    assert isinstance(back, torch.Tensor) and back.shape == out.shape
    torch.testing.assert_close(back.reshape(4, 6) * 2.0, new)


def test_writers_keep_every_later_tuple_item() -> None:
    new, aux = _t(4, 4), ("bias", "extra")
    assert column_slice(3, 7)[1]((), {}, (_t(4, 10), *aux), new)[1:] == aux
    assert head_slice(1, 1, 0, 4)[1]((), {}, (_t(4, 4), *aux), new)[1:] == aux
    assert post_out()[1]((), {}, (_t(4, 4), *aux), new)[1:] == aux
    assert scaled_out(2.0)[1]((), {}, (_t(4, 4), *aux), new)[1:] == aux


def test_branch_sum_defaults_to_an_unscaled_sum_and_names_the_missing_output() -> None:
    routed, shared = _t(3, 4), _t(3, 4)
    branch = BranchSum()
    read, write = branch.rw()
    branch.companion(None, (), (routed, "router"))
    assert torch.equal(read((), {}, shared), routed + shared)
    new = _t(3, 4)
    torch.testing.assert_close(routed + write((), {}, shared, new), new)
    with pytest.raises(RuntimeError) as info:
        BranchSum().rw()[0]((), {}, shared)
    assert str(info.value) == (
        "the routed MLP's output of this forward was not seen before the shared one"
    )
