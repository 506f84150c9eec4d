"""`python -m ie_evals.lm_eval_cli ...` (or `ie-lm-eval ...`): the `lm_eval` command with the
`interp-engine` model registered first (lm-eval discovers no models by entry point)."""

from __future__ import annotations


def main() -> None:
    from lm_eval.__main__ import cli_evaluate

    import ie_evals.lm_eval_model  # noqa: F401  (registers "interp-engine")

    cli_evaluate()


if __name__ == "__main__":
    main()
