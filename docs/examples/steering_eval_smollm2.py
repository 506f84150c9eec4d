"""Worked example: one steering vector's effect on a small local multiple-choice set, measured
with lm-evaluation-harness through ie-evals' `interp-engine` model on SmolLM2-135M-Instruct.

The set (written here, 24 reviews) asks for a review's sentiment, " positive" or " negative". The
vector is a difference of means at `resid_post.LAYER` between positive and negative sentences that
are not in the set (the mean over each sentence's tokens), times a coefficient. Each coefficient runs the whole task
with that vector added at every position through an interventions file, and reports accuracy
and the share of " positive" answers: a working vector moves the share with its sign. Writes
docs/notes/steering_eval_smollm2.json.

    uv run python docs/examples/steering_eval_smollm2.py [--backend eager] [--layer 15]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from ie_core import Additive, load_model, steer_at
from ie_core.runner import run
from ie_evals import write_interventions
from ie_evals.lm_eval_model import InterpEngineLM
from lm_eval.evaluator import simple_evaluate
from lm_eval.tasks import TaskManager

ROOT = Path(__file__).resolve().parents[2]
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
CHOICES = [" positive", " negative"]
POSITIVE = [
    "An absolute delight from start to finish.",
    "The staff were warm and the food was superb.",
    "I loved every minute of it.",
    "Brilliant, moving and beautifully made.",
    "Works perfectly and arrived early.",
    "The best purchase I have made this year.",
    "A charming, funny and uplifting story.",
    "Exceeded every expectation I had.",
    "Fantastic value, I would buy it again.",
    "The view was breathtaking and the room spotless.",
    "A joy to use every single day.",
    "Wonderful performances and a great script.",
]
NEGATIVE = [
    "A complete waste of time and money.",
    "The staff were rude and the food was cold.",
    "I hated every minute of it.",
    "Dull, confusing and badly made.",
    "It broke after two days and support never answered.",
    "The worst purchase I have made this year.",
    "A tedious, joyless and predictable story.",
    "Fell short of every expectation I had.",
    "Overpriced junk, I want a refund.",
    "The room was filthy and the view was a wall.",
    "A chore to use and it crashes constantly.",
    "Wooden acting and a terrible script.",
]
# The vector's sentences: not in the evaluated set.
CONTRAST = (
    ["I am so happy, this is wonderful.", "What a lovely, perfect day.", "Great, I love it."],
    ["I am so sad, this is awful.", "What a miserable, horrible day.", "Terrible, I hate it."],
)


def write_task(folder: Path) -> str:
    docs = [
        {"text": t, "choices": CHOICES, "answer": 0 if t in POSITIVE else 1}
        for pair in zip(POSITIVE, NEGATIVE, strict=True)
        for t in pair
    ]
    data = folder / "sentiment.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "sentiment.yaml").write_text(
        "task: sentiment\ndataset_path: json\ntest_split: test\noutput_type: multiple_choice\n"
        f"dataset_kwargs: {{data_files: {{test: {data}}}}}\n"
        "target_delimiter: ''\n"
        "doc_to_text: 'Review: {{text}}\\nIs this review positive or negative?\\nAnswer:'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\n"
        "metric_list: [{metric: acc, aggregation: mean, higher_is_better: true}]\n"
    )
    return "sentiment"


def mean_row(model: Any, texts: list[str], address: str) -> torch.Tensor:
    rows = [run(model.capture(model.to_tokens(t), [address]))[address][0].mean(0) for t in texts]
    return torch.stack(rows).mean(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", default="eager")
    parser.add_argument("--layer", type=int, default=15)
    parser.add_argument("--coeffs", default="-2,-1,-0.5,0,0.5,1,2")
    parser.add_argument("--out", default=str(ROOT / "docs/notes/steering_eval_smollm2.json"))
    args = parser.parse_args()
    kw = {"device": "cpu", "dtype": "float32"} if args.backend == "eager" else {}
    model = load_model(MODEL, backend=args.backend, **kw)
    address = f"resid_post.{args.layer}"
    vector = mean_row(model, CONTRAST[0], address) - mean_row(model, CONTRAST[1], address)
    folder = Path(tempfile.mkdtemp())
    task = write_task(folder)
    manager = TaskManager(include_path=str(folder), include_defaults=False)
    rows = []
    for coeff in (float(c) for c in args.coeffs.split(",")):
        spec = steer_at(address, Additive(vector, coeff))
        file = write_interventions(folder / f"steer_{coeff:+g}.json", spec) if coeff else None
        lm = InterpEngineLM(model=model, interventions=str(file) if file else None)
        out: Any = simple_evaluate(lm, tasks=[task], task_manager=manager, log_samples=True)
        picks = [
            max(range(len(CHOICES)), key=lambda i, s=s: s["resps"][i][0][0])
            for s in out["samples"][task]
        ]
        row = {
            "coeff": coeff,
            "accuracy": out["results"][task]["acc,none"],
            "share_positive": picks.count(0) / len(picks),
        }
        rows.append(row)
        print(row)
    record = {
        "model": MODEL,
        "backend": args.backend,
        "address": address,
        "vector": "mean(rows | positive contrast) - mean(rows | negative contrast), times coeff",
        "vector_norm": float(vector.norm()),
        "items": len(POSITIVE) + len(NEGATIVE),
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
