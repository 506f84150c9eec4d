"""An lm-eval task's data, checked before the model loads.

lm-eval builds its tasks (and downloads their datasets) only after it has loaded the model, so a
stock task such as `arc_easy` without the Hugging Face Hub fails after a model load of a minute.
`ie-lm-eval` checks first: with the Hub unreachable it works offline (`HF_HUB_OFFLINE=1`,
`HF_DATASETS_OFFLINE=1`: the datasets library then reads only its cache instead of retrying the
network for ~20 s), then builds the requested tasks, which loads their data, and refuses with
`TaskDataError` if that fails, before anything loads the model.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

from ie_core.errors import InterpError

__all__ = ["TaskDataError", "check_task_data", "hub_reachable", "offline_without_hub"]

HUB = "https://huggingface.co"
OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


class TaskDataError(InterpError, RuntimeError):
    """An lm-eval task whose data cannot be loaded (refused before the model loads)."""


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the Hub's endpoint (`HF_ENDPOINT`) opens within `timeout`."""
    url = urlparse(os.environ.get("HF_ENDPOINT", HUB))
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False


def offline_without_hub() -> bool:
    """Set the offline variables when the Hub is unreachable and the user set neither; returns
    whether it did. Call it before `datasets` or `huggingface_hub` is imported (they read the
    variables once)."""
    if any(os.environ.get(v) for v in OFFLINE_VARS) or hub_reachable():
        return False
    for name in OFFLINE_VARS:
        os.environ[name] = "1"
    return True


def check_task_data(tasks: str, include_path: str | None = None) -> None:
    """Resolve `tasks` (lm-eval's `--tasks`: names, groups, YAML files, comma-separated) as
    lm-eval's command line does and build them, which loads their datasets (lm-eval's own build
    after the model load then reads them from the cache), or raise TaskDataError naming what
    failed."""
    from datasets.exceptions import DatasetNotFoundError
    from lm_eval.config.evaluate_config import EvaluatorConfig

    config = EvaluatorConfig(tasks=tasks, include_path=include_path)
    try:
        config.process_tasks().load(config.tasks)
    except (OSError, DatasetNotFoundError) as exc:
        offline = [v for v in OFFLINE_VARS if os.environ.get(v)]
        why = f" ({' and '.join(offline)} set: only the local cache is read)" if offline else ""
        raise TaskDataError(
            f"the data of lm-eval task(s) {tasks} cannot be loaded{why}: {exc}. "
            "Stock lm-eval tasks download their datasets from the Hugging Face Hub; without it, "
            "write a local task (a YAML with dataset_path: json and a jsonl file, passed with "
            "--include_path; docs/USAGE.md, 'Evaluating interventions'), or load the dataset "
            "into the HF datasets cache where the Hub is reachable. The model was not loaded."
        ) from exc
