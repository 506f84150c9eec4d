"""The in-worker reducer mechanism without an engine: batched groups split back per job equal
each job run alone, `cast` keeps values, and a spec survives its wire form."""

from __future__ import annotations

import torch
from ie_core.experiments.sae_math import DictMeta, encode
from ie_core.reduce import Cast, DictionaryFeatures
from ie_vllm.specs import ReducerSpec, RequestSpec
from ie_vllm.worker import reducers


def _put(key: str, seed: int, meta: DictMeta) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = {"W_enc": torch.randn(8, 20, generator=g), "b_enc": torch.randn(20, generator=g),
         "W_dec": torch.randn(20, 8, generator=g), "b_dec": torch.randn(8, generator=g)}  # fmt: skip
    reducers.put_dictionary(key, w, meta.to_dict(), "cpu")
    return w


def test_grouped_jobs_equal_each_job_alone() -> None:
    meta = DictMeta("topk", k=4, b_dec_in=True)
    wa, wb = _put("t-a", 0, meta), _put("t-b", 1, DictMeta("relu"))
    a = ReducerSpec("x", "resid_post.0", DictionaryFeatures("t-a", 3, True))
    b = ReducerSpec("y", "resid_post.0", DictionaryFeatures("t-b", None, False))
    rows = [torch.randn(n, 8) for n in (3, 1, 5)]
    jobs = [(a, (0, rows[0])), (b, (0, rows[1])), (a, (0, rows[2]))]
    together = reducers.run(jobs)
    for (spec, x), got in zip(jobs, together, strict=True):
        alone = reducers.run([(spec, x)])[0]
        assert got.keys() == alone.keys()
        for name in got:
            # A batch of another height may take another BLAS kernel (seen on an AMD EPYC host:
            # 4e-7 relative), so values agree to float32 rounding and indices exactly.
            if got[name].is_floating_point():
                torch.testing.assert_close(got[name], alone[name], rtol=1e-5, atol=1e-6)
            else:
                assert torch.equal(got[name], alone[name])
    assert torch.allclose(together[1]["acts"], encode(rows[1], wb, DictMeta("relu")))
    want = encode(rows[2], wa, meta).topk(3, dim=-1).values
    assert torch.allclose(together[2]["values"], want)
    assert together[0]["ids"].shape == (3, 3) and together[2]["sq_error"].shape == (5,)


def test_cast_and_wire_round_trip() -> None:
    x = torch.randn(4, 8)
    cast = ReducerSpec("h", "resid_post.1", Cast("bfloat16"), position=2)
    (out,) = reducers.run([(cast, (2, x))])
    assert out["rows"].dtype == torch.bfloat16 and torch.equal(out["rows"], x.bfloat16())
    spec = RequestSpec("k", ("resid_post.1",), (), 4, (cast,))
    assert RequestSpec.from_wire(spec.to_wire()) == spec
