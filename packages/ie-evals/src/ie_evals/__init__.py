"""interp-engine in the standard eval harnesses: the interventions file shared with `ie serve`, the
scoring every harness adapter uses, an lm-evaluation-harness model (`ie_evals.lm_eval_model`,
extra `lm-eval`) and an Inspect AI provider (`ie_evals.inspect_provider`, extra `inspect`).
Importing this package imports neither harness."""

from ie_evals.interventions import (
    InterventionsFileError,
    check_interventions,
    load_interventions,
    parse_interventions,
    write_interventions,
)
from ie_evals.scoring import Scored, generate_continuations, score_continuations

__all__ = [
    "InterventionsFileError",
    "Scored",
    "check_interventions",
    "generate_continuations",
    "load_interventions",
    "parse_interventions",
    "score_continuations",
    "write_interventions",
]
