"""`ie serve MODEL --backend vllm-static`: the static worker behind vLLM's own OpenAI server.

`ie serve` (ie-vllm) finds this module through the `ie.serve` entry point. `serve_args` turns
the `--static-*` options into the `vllm serve` arguments the static engine needs (its worker
class, the declared sites in `--additional-config`, the buffer rows as
`--max-num-batched-tokens`); `served_model` wraps the server's engine client in the same
`StaticModel` the in-process backend builds, after the same checks (declared sites resolved,
self-test), so a server that would serve wrong numbers does not start.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ie_core.errors import UnsupportedOperationError
from ie_core.grammar import family_for_architecture
from ie_vllm import Engine, merge_infos

from ie_static.backend import StaticModel
from ie_static.config import CONFIG_KEY, StaticConfig
from ie_static.declared import declared_sets, refuse_unresolved
from ie_static.launch import DEFAULT_BUFFER_GIB, plan_launch
from ie_static.tap_info import merge_taps

# What the user declared (before expansion), for the unresolved-site check at start-up.
DECLARED_KEY = "ie_static_declared"


def _declaration(text: str) -> Any:
    return "auto" if text == "auto" else [p.strip() for p in text.split(",") if p.strip()]


def _options(rest: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="ie serve --backend vllm-static", add_help=False)
    parser.add_argument("--static-points", default="auto")
    parser.add_argument("--static-writes", default="auto")
    parser.add_argument("--static-slots", type=int, default=16)
    parser.add_argument("--static-max-ops", type=int, default=4)
    parser.add_argument("--static-masks", type=int, default=4)
    parser.add_argument("--static-buffer-gib", type=float, default=DEFAULT_BUFFER_GIB)
    # vLLM's own options this backend reads (they stay in the argument list).
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--max-num-batched-tokens", type=int)
    parser.add_argument("--dtype")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--worker-cls")
    parser.add_argument("--additional-config")
    return parser.parse_known_args(rest)


def serve_args(model: str, rest: list[str]) -> list[str]:
    """`rest` with the `--static-*` options replaced by the vLLM arguments they imply."""
    opts, _ = _options(rest)
    if opts.enforce_eager:
        raise UnsupportedOperationError(
            "ie serve --backend vllm-static keeps torch.compile and CUDA graphs on, so "
            "--enforce-eager is refused; use --backend vllm for an eager, hooked server"
        )
    if opts.worker_cls or opts.additional_config:
        raise UnsupportedOperationError(
            "ie serve --backend vllm-static sets --worker-cls and --additional-config itself; "
            "drop them (declare sites with --static-points / --static-writes)"
        )
    points, writes = _declaration(opts.static_points), _declaration(opts.static_writes)
    launch = plan_launch(
        model,
        points,
        writes,
        slots=opts.static_slots,
        max_ops=opts.static_max_ops,
        masks=opts.static_masks,
        dtype=opts.dtype,
        max_model_len=opts.max_model_len,
        buffer_gib=opts.static_buffer_gib,
        requested_rows=opts.max_num_batched_tokens,
    )
    extra = {
        CONFIG_KEY: launch.config.to_dict(),
        DECLARED_KEY: {"points": points, "writes": writes},
    }
    kept = _without_static_options(rest)
    out = ["--worker-cls", launch.worker_cls]
    out += ["--additional-config", json.dumps(extra)]
    if opts.max_num_batched_tokens is None:
        out += ["--max-num-batched-tokens", str(launch.plan.rows)]
    if "--max-num-seqs" not in kept:
        out += ["--max-num-seqs", str(launch.max_num_seqs)]
    return kept + out


def _without_static_options(rest: list[str]) -> list[str]:
    out, skip = [], False
    for arg in rest:
        if skip:
            skip = False
            continue
        if arg.startswith("--static-"):
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


async def served_model(engine_client: Any, args: argparse.Namespace) -> StaticModel:
    """The server's engine as a `StaticModel`: declared sites checked, self-test passed."""
    from transformers import AutoTokenizer

    extra = args.additional_config
    if isinstance(extra, str):
        extra = json.loads(extra)
    config = StaticConfig.from_dict(extra[CONFIG_KEY])
    info = merge_infos(await engine_client.collective_rpc("ie_setup", args=(False,)))
    static_info = merge_taps(await engine_client.collective_rpc("ie_static_setup"))
    architecture = info.architecture
    wanted = extra.get(DECLARED_KEY, {"points": "auto", "writes": "auto"})
    declared = declared_sets(
        wanted["points"],
        wanted["writes"],
        info.n_layers,
        family_for_architecture(architecture),
    )
    refuse_unresolved(declared, static_info, architecture)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    name = (getattr(args, "served_model_name", None) or [args.model])[0]
    engine = Engine(engine_client, ())
    model = StaticModel(engine, info, tokenizer, name, config, static_info)
    await model.self_test()
    return model


__all__ = ["DECLARED_KEY", "serve_args", "served_model"]
