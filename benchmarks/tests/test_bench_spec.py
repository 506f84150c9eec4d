"""The spec and everything that reads cells import no torch, and the grid is what the issue names."""

from __future__ import annotations

import subprocess
import sys

from ie_bench.spec import MID, PROFILES, VARIANTS, WORKLOADS, get_profile, resolve_kwargs


def test_reading_side_imports_no_torch() -> None:
    code = (
        "import sys, ie_bench.spec, ie_bench.cells, ie_bench.report, ie_bench.publish, ie_bench.cli;"
        "bad = [m for m in ('torch', 'vllm', 'transformers') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_grid_names() -> None:
    assert [v.key for v in VARIANTS] == [
        "eager", "vllm", "vllm-static", "vllm-eager", "vllm-generate",
    ]  # fmt: skip
    assert [w.key for w in WORKLOADS] == [
        "generate", "generate_x8", "capture_mid", "capture_all", "capture_gen", "steer", "lens_topk",
    ]  # fmt: skip


def test_gpu_profile_is_the_seed_sizes() -> None:
    gpu = get_profile("gpu")
    assert (gpu.prompt_tokens, gpu.new_tokens, gpu.concurrency, gpu.lens_rows) == (512, 128, 8, 512)
    assert {p.name for p in PROFILES} >= {"gpu", "cpu"}


def test_static_variant_resolves_its_mid_write_site() -> None:
    static = next(v for v in VARIANTS if v.key == "vllm-static")
    kwargs = resolve_kwargs(static.load_kwargs, 15)
    assert kwargs == {"static_points": "auto", "static_writes": ["resid_post.15"]}
    assert MID not in str(kwargs)


def test_figures_are_each_metrics_best_repeat_or_the_median() -> None:
    import dataclasses

    from ie_bench.spec import aggregate

    cpu = get_profile("cpu")
    assert cpu.aggregate == "best"
    assert aggregate(cpu, "generate", "decode_tok_s", [12.0, 13.3, 9.0]) == 13.3  # higher
    assert aggregate(cpu, "generate", "ttft_s", [0.4, 0.3, 0.9]) == 0.3  # lower
    assert aggregate(cpu, "generate", "unlisted", [1.0, 5.0, 2.0]) == 2.0  # no direction: median
    median = dataclasses.replace(cpu, aggregate="median")
    assert aggregate(median, "generate", "decode_tok_s", [12.0, 13.3, 9.0]) == 12.0
