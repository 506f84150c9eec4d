"""Backend `vllm-static`: vLLM compiled (and on a GPU, graph-captured) with taps declared at load.

The host side is ie-vllm's `VLLMModel` with two changes, both through ie-vllm's declared seam:
the engine runs compiled with the static worker class, reached through `StaticChannel` (which
hands each steered request one of the engine's parameter slots), and `StaticPolicy` lets a request
read and write only the sites the engine declared.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from ie_core.errors import PointUnavailableError, UnsupportedOperationError
from ie_core.grammar import Address, to_address
from ie_core.model_info import ModelInfo
from ie_core.ops import Additive, steer_at
from ie_core.protocol import SamplingParams
from ie_core.runner import run
from ie_vllm import Engine, VLLMModel, check_data_parallel, merge_infos

from ie_static.channel import StaticChannel
from ie_static.config import CONFIG_KEY, StaticConfig
from ie_static.declared import BACKEND, refuse_unresolved
from ie_static.launch import DEFAULT_BUFFER_GIB, plan_launch
from ie_static.policy import StaticPolicy, reload_hint
from ie_static.tap_info import TapInfo, merge_taps

SELF_TEST_PROMPT = "The capital of France is"


class SelfTestError(RuntimeError):
    """The warm-up self-test failed; the engine is shut down rather than serve wrong numbers."""


# --- the model ---------------------------------------------------------------------------------


class StaticModel(VLLMModel):
    """A vLLM engine compiled with taps at the declared sites; see `load`."""

    def __init__(
        self,
        engine: Engine,
        info: ModelInfo | Mapping[str, Any],
        tokenizer: Any,
        model_id: str,
        config: StaticConfig,
        static_info: TapInfo,
    ) -> None:
        # What the worker installed: the declared set less what this model lacks.
        self.reads: tuple[str, ...] = static_info.reads
        self.writes: tuple[str, ...] = static_info.writes
        super().__init__(
            engine,
            info,
            tokenizer,
            model_id,
            BACKEND,
            channel=StaticChannel(engine, config.slots),
            policy=StaticPolicy(self.reads, self.writes, config, static_info.refused),
        )
        self.config = config
        self.static_info = static_info

    @classmethod
    async def create_static(
        cls,
        model_id: str,
        *,
        static_points: Any = "auto",
        static_writes: Any = "auto",
        static_slots: int = 16,
        static_max_ops: int = 4,
        static_masks: int = 4,
        static_patch_rows: int = 16,
        static_buffer_gib: float = DEFAULT_BUFFER_GIB,
        self_test: bool = True,
        **kw: Any,
    ) -> StaticModel:
        if kw.get("enforce_eager"):
            raise UnsupportedOperationError(
                "backend 'vllm-static' exists to keep torch.compile and CUDA graphs on, so "
                "enforce_eager=True is refused; use backend='vllm' for an eager, hooked engine"
            )
        check_data_parallel(kw, BACKEND)
        launch = plan_launch(
            model_id,
            static_points,
            static_writes,
            slots=static_slots,
            max_ops=static_max_ops,
            masks=static_masks,
            patch_rows=static_patch_rows,
            dtype=kw.get("dtype"),
            max_model_len=kw.get("max_model_len"),
            buffer_gib=static_buffer_gib,
            requested_rows=kw.get("max_num_batched_tokens"),
        )
        from transformers import AutoTokenizer

        kw["max_num_batched_tokens"] = launch.plan.rows
        kw.setdefault("max_num_seqs", launch.max_num_seqs)
        extra = dict(kw.pop("additional_config", None) or {})
        extra[CONFIG_KEY] = launch.config.to_dict()
        engine = await Engine.start(
            launch.source,
            hooked=False,
            worker_cls=launch.worker_cls,
            additional_config=extra,
            **kw,
        )
        try:
            info = merge_infos(await engine.rpc("ie_setup", False))  # stage by stage
            taps = merge_taps(await engine.rpc("ie_static_setup"))
            static_info = taps.planned(launch.plan.total)
            refuse_unresolved(launch.declared, static_info, launch.architecture)
            tokenizer = AutoTokenizer.from_pretrained(launch.source)
            model = cls(engine, info, tokenizer, model_id, launch.config, static_info)
            if self_test:
                await model.self_test()
        except BaseException:
            engine.shutdown()
            raise
        return model

    # --- declared sets ---------------------------------------------------------------------

    def points(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(to_address(a).name for a in self.reads))

    def attention_layers(self) -> Sequence[int]:
        """The declared `attn_probs` layers (attention recomputed from q and k)."""
        parsed = [to_address(a) for a in self.reads]
        layers = [a.layer for a in parsed if a.name == "attn_probs" and a.layer is not None]
        if not layers:
            raise PointUnavailableError(
                "capture_attention reads attn_probs, and this vllm-static engine declared "
                "no attn_probs sites; "
                f"{reload_hint('attn_probs', False)}"
            )
        return layers

    # --- self-test -------------------------------------------------------------------------

    async def self_test(self) -> dict[str, Any]:
        """A read site is finite and non-zero; a sentinel write changes the greedy output."""
        ids = self.to_tokens(SELF_TEST_PROMPT)
        first = next(a for a in self.reads if not a.startswith(("attn_scores", "attn_probs")))
        cache = await self.capture(ids, [first])
        rows = cache[first].float()
        if not torch.isfinite(rows).all() or not rows.abs().sum() > 0:
            raise SelfTestError(
                f"vllm-static self-test: the tap at {first} read {'non-finite' if not torch.isfinite(rows).all() else 'all-zero'} "
                "values, so the taps are not in the compiled graph; this engine will not serve. "
                "Use backend='vllm' and report the vLLM version"
            )
        result: dict[str, Any] = {"read_site": first, "read_norm": float(rows.norm())}
        if self.writes:
            # One vector added to every key moves no softmax (each query's scores shift by a
            # constant), so a key site could leave the output unchanged with its taps working.
            moving = [w for w in self.writes if to_address(w).name not in ("k", "k_rot")]
            site = (moving or list(self.writes))[len(moving or self.writes) // 2]
            sp = SamplingParams(max_new_tokens=4, stop_at_eos=False)
            base = await self.generate(ids, sp)
            scale = 50.0 * float(
                (await self.capture(ids, [site]))[site].float().norm(dim=-1).mean()
            )
            g = torch.Generator().manual_seed(0)
            vector = torch.randn(self.point_width(site), generator=g)
            sentinel = steer_at(site, Additive(vector / vector.norm(), scale))
            steered = await self.generate(ids, sp, steering=sentinel)
            if steered.token_ids == base.token_ids:
                raise SelfTestError(
                    f"vllm-static self-test: a sentinel write at {site} left the greedy output "
                    "unchanged, so the write taps are not in the compiled graph; this engine will "
                    "not serve. Use backend='vllm' and report the vLLM version"
                )
            result |= {"write_site": site, "base": base.token_ids, "steered": steered.token_ids}
        return result


def load(
    model_id: str, *, static_points: Any = "auto", static_writes: Any = "auto", **kw: Any
) -> StaticModel:
    """Entry point `vllm-static`: `static_points` / `static_writes` declare the tapped sites."""
    if isinstance(model_id, Path):
        model_id = str(model_id)
    return run(
        StaticModel.create_static(
            model_id, static_points=static_points, static_writes=static_writes, **kw
        )
    )


async def create(model_id: str, **kw: Any) -> StaticModel:
    """Async construction on the caller's loop."""
    return await StaticModel.create_static(model_id, **kw)


__all__ = ["Address", "StaticModel", "create", "load"]
