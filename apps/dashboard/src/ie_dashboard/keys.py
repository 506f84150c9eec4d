"""Natural keys: which ingested cell or validator result a row is, as one unambiguous string.

The fields are encoded as a JSON array (`["org/model","vllm","cpu","2026-..."]`): JSON escapes
quotes and backslashes inside each field, so two different tuples never give one key. The old
`model|variant|...` join let `team|x` + `vllm` and `team` + `x|vllm` overwrite each other.
"""

from __future__ import annotations

import json

__all__ = ["cell_key", "graph_key", "record_key", "run_key"]


def _encode(*fields: str) -> str:
    return json.dumps(list(fields), ensure_ascii=True, separators=(",", ":"))


def cell_key(model: str, variant: str, profile: str, started: str) -> str:
    """A benchmark cell: (model id, variant key, profile name, UTC start time)."""
    return _encode(model, variant, profile, started)


def run_key(hf_id: str, engine: str, captured_at: str) -> str:
    """A validator result: (model id, engine, UTC capture time)."""
    return _encode(hf_id, engine, captured_at)


def graph_key(slug: str, digest: str) -> str:
    """An attribution graph: (slug, SHA-256 of its canonical JSON); slugs default to a file's
    stem ("graph"), so the content decides identity and a re-traced graph is a new row."""
    return _encode(slug, digest)


def record_key(source: str, section: str) -> str:
    """A workload record's section: (record file, section key); re-reading the file replaces it."""
    return _encode(source, section)


def atlas_key(model: str, dictionary_key: str, digest: str) -> str:
    """An atlas: (model, the dictionary's content key, SHA-256 of the folder's state file), so
    the same folder imported twice is one row and a rerun over more text is another."""
    return _encode(model, dictionary_key, digest)
