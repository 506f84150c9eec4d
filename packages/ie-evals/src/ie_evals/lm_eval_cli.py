"""`python -m ie_evals.lm_eval_cli ...` (or `ie-lm-eval ...`): the `lm_eval` command with the
`interp-engine` model registered first (lm-eval discovers no models by entry point), and the
tasks' data checked before lm-eval loads the model (`ie_evals.task_data`)."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main", "requested_tasks"]


def requested_tasks(argv: list[str]) -> tuple[list[str], str | None]:
    """(tasks, include path) of an lm-eval `run` command line; ([], None) for any other."""
    if argv and argv[0] in {"ls", "validate"}:
        return [], None
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--tasks", "-t", default="")
    p.add_argument("--include_path")
    known, _ = p.parse_known_args(argv)
    names = [t for chunk in known.tasks.split(",") for t in [chunk.strip()] if t]
    return names, known.include_path


def main() -> None:
    from ie_evals.task_data import offline_without_hub

    argv = sys.argv[1:]
    tasks, include = requested_tasks(argv)
    if tasks and offline_without_hub():  # before datasets / huggingface_hub are imported
        print("ie-lm-eval: the Hugging Face Hub is not reachable: HF_HUB_OFFLINE=1 and "
              "HF_DATASETS_OFFLINE=1 for this run (cached data only)", file=sys.stderr)  # fmt: skip
    from lm_eval.__main__ import cli_evaluate

    import ie_evals.lm_eval_model  # noqa: F401  (registers "interp-engine")

    if tasks:
        from ie_evals.task_data import TaskDataError, check_task_data

        try:
            check_task_data(",".join(tasks), include)
        except TaskDataError as exc:
            print(f"ie-lm-eval: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
    cli_evaluate()


if __name__ == "__main__":
    main()
