"""Splicing a dictionary into the model: run each prompt with the dictionary's point replaced by
its reconstruction (or by reconstruction + error, which is the clean run up to rounding) and
score the next-token loss, beside the clean run's.

It is composed from what every backend serves: one clean capture of the dictionary's point(s) and
of the last residual, the reconstruction computed here (`ie_core.experiments.sae_math`), then one `Patch` per
prompt writing it at `sae.out_address`. That is the splice exactly, not an approximation: the rows
a dictionary reads lie upstream of (or at) the point it writes, so writing there cannot change
them. Logits come from the last residual through the backend's own lens, chunked as in
`patch_sweep` (`patching.decode_rows`), so a remote answer stays within the server's size budget.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ie_core.errors import UnsupportedOperationError
from ie_core.experiments.features import check_dictionary
from ie_core.experiments.patching import decode_rows
from ie_core.experiments.sae_math import decode, encode, normalized
from ie_core.experiments.saes import SAE
from ie_core.ops import Patch, steer_at
from ie_core.prompts import prompt_batch
from ie_core.protocol import InterpModel
from ie_core.runner import run
from ie_core.sync import ModelLike, unwrap

__all__ = ["SpliceResult", "splice", "spliced_rows"]


@dataclass(frozen=True)
class SpliceResult:
    """Next-token cross-entropy `[batch, seq - 1]` (position t predicts token t + 1), spliced and
    clean; `logits` `[batch, seq, vocab]` of the spliced run when asked for."""

    loss: torch.Tensor
    clean_loss: torch.Tensor
    logits: torch.Tensor | None = None

    @property
    def delta(self) -> torch.Tensor:
        """How much the splice raises each token's loss."""
        return self.loss - self.clean_loss


def spliced_rows(sae: SAE, x: torch.Tensor, out: torch.Tensor, keep_error: bool) -> torch.Tensor:
    """What the splice writes at `sae.out_address`: the reconstruction of input rows `x`, plus the
    error `out - reconstruction` (`out` = the point's clean rows) when `keep_error`."""
    _, mu, std = normalized(x, sae.meta)
    if sae.is_transcoder:
        mu, std = None, None  # a transcoder's output is not in its input's scale
    recon = decode(encode(x, sae.weights, sae.meta), sae.weights, mu, std)
    return recon + (out.float() - recon) if keep_error else recon


def splice(
    model: ModelLike,
    prompts: Any,
    sae: SAE,
    *,
    keep_error: bool = False,
    logits: bool = False,
) -> SpliceResult:
    """Per-token next-token loss with `sae` spliced in at its point, and without (clean)."""
    return _splice(unwrap(model), prompts, sae, keep_error, logits)


def _splice(
    model: InterpModel, prompts: Any, sae: SAE, keep_error: bool, logits: bool
) -> SpliceResult:
    check_dictionary(model, sae)
    if sae.is_transcoder and sae.meta.normalize != "none":
        raise UnsupportedOperationError(
            "a transcoder with input normalisation has no defined output scale to splice; fold "
            "the normalisation into its weights"
        )
    batch = _prompts(model, prompts)
    last = f"resid_post.{model.n_layers - 1}"
    points = list(dict.fromkeys((sae.address, sae.out_address, last)))
    clean: Any = run(model.capture(batch, points))  # type: ignore[arg-type]
    new = spliced_rows(sae, clean[sae.address], clean[sae.out_address], keep_error)
    positions = tuple(range(len(batch[0])))

    async def patched() -> list[Any]:
        import asyncio

        specs = [steer_at(sae.out_address, Patch(rows, positions)) for rows in new]
        runs = [
            model.capture([ids], [last], steering=s) for ids, s in zip(batch, specs, strict=True)
        ]
        return list(await asyncio.gather(*runs))

    caches = run(patched())
    spliced = torch.cat([c[last] for c in caches])
    ids = torch.tensor(batch)
    out = _lens(model, spliced)
    return SpliceResult(
        _loss(out, ids), _loss(_lens(model, clean[last]), ids), out if logits else None
    )


def _prompts(model: InterpModel, prompts: Any) -> tuple[tuple[int, ...], ...]:
    texts = [prompts] if isinstance(prompts, str) else prompts
    if isinstance(texts, Sequence) and texts and all(isinstance(t, str) for t in texts):
        batch = tuple(tuple(model.to_tokens(t)) for t in texts)
    else:
        batch = prompt_batch(prompts, model.to_tokens, sys.maxsize)  # the backend checks ids
    if len({len(p) for p in batch}) > 1:
        raise ValueError(
            f"prompts of different lengths {[len(p) for p in batch]} cannot share one "
            "[batch, seq] loss; splice them one at a time or pad them to one length"
        )
    if len(batch[0]) < 2:
        raise ValueError("a next-token loss needs prompts of at least 2 tokens")
    return batch


def _lens(model: InterpModel, rows: torch.Tensor) -> torch.Tensor:
    """`[batch, seq, vocab]` fp32 logits of last-layer residual rows through the model's lens."""
    flat = run(decode_rows(model, rows.reshape(-1, rows.shape[-1])))
    return flat.reshape(*rows.shape[:-1], -1)


def _loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return -logp.gather(-1, ids[:, 1:].unsqueeze(-1).to(logp.device)).squeeze(-1).cpu()
