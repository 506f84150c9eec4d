"""Helpers the ie-evals tests import: local lm-eval tasks written into a folder (YAML + jsonl, no
download) and the hand reference: continuation log-probabilities from a plain Hugging Face forward,
optionally with a vector added to one decoder block's output by a forward hook written here."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

# Local json files only: the datasets library must not look anything up on a hub.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

CHOICES = (" A", " B")
QUESTIONS = tuple(
    f"Question {i}: which letter does the {word} pick?"
    for i, word in enumerate(
        ["cat", "dog", "sun", "river", "stone", "cloud", "tree", "ship", "lamp", "road", "bird"]
    )
)


def write_mc_task(folder: Path, name: str, docs: Sequence[dict[str, Any]]) -> str:
    """A multiple-choice task over `docs` ({question, choices, answer}) scored by `acc`."""
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'target_delimiter: ""\n'  # the choices carry their own leading space
        'doc_to_text: "{{question}}"\n'
        'doc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n",
        encoding="utf-8",
    )
    return name


def split_pair(tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's split: the whole text tokenised, the context's tokens cut off its front."""
    whole = tokenizer(context + continuation)["input_ids"]
    ctx = tokenizer(context)["input_ids"]
    return list(ctx), list(whole[len(ctx) :])


def hf_logprob(
    hf: Any,
    context: Sequence[int],
    continuation: Sequence[int],
    vector: torch.Tensor | None = None,
    layer: int = 0,
) -> tuple[float, bool]:
    """sum_j log p(cont_j | ...) from one forward of the plain HF model (fp64 log-softmax of its
    fp32 logits); `vector` is added to decoder block `layer`'s output at every position."""
    ids = [*context, *continuation]

    def add(module: torch.nn.Module, args: tuple, output: Any) -> Any:
        if isinstance(output, tuple):
            return (output[0] + vector, *output[1:])
        return output + vector

    block = hf.model.layers[layer]
    handle = block.register_forward_hook(add) if vector is not None else None
    try:
        with torch.no_grad():
            logits = hf(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    finally:
        if handle is not None:
            handle.remove()
    rows = logits[len(context) - 1 : len(ids) - 1].double()
    logp = torch.log_softmax(rows, dim=-1)
    want = torch.tensor(list(continuation))
    total = float(logp.gather(1, want[:, None]).sum())
    greedy = bool((rows.argmax(-1) == want).all())
    return total, greedy


def close(got: float, want: float, rel: float) -> bool:
    """|got - want| within `rel` of max(1, |want|) (a summed log-probability's scale)."""
    return abs(got - want) <= rel * max(1.0, abs(want))
