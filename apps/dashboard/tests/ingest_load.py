"""Client side of the multi-process ingest test: one process posting its share over HTTP.

Kept apart from the test module so each spawned process imports only httpx and this file.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

THREADS = 8


def post_share(base_url: str, token: str, results: list[dict[str, Any]]) -> list[int]:
    """Post every validator result from THREADS threads at once; the status codes, in order."""
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=120) as client:

        def post(result: dict[str, Any]) -> int:
            return client.post("/api/validator", json=result).status_code

        with ThreadPoolExecutor(THREADS) as pool:
            return list(pool.map(post, results))
