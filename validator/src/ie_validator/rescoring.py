"""Re-applying the gates to committed results: every point's metrics are stored (cos, max abs,
relative error), so a change of gates re-scores the matrix without re-running any engine."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from ie_core.tooling.records import ValidatorResult

from ie_validator.results import load_results, write_result
from ie_validator.scoring import Status, Tier, gate_status, verdict

__all__ = ["rescore", "rescore_all"]


def _rescore_point(point: dict[str, Any], dtype: str, quantization: str) -> dict[str, Any]:
    # Points without metrics were decided structurally (n/a, shape, zeros, NaN): kept as they are.
    if point["cos"] is None or point["rel_diff"] is None:
        return point
    status, reason = gate_status(
        Tier(point["tier"]), point["cos"], point["rel_diff"], dtype, quantization
    )
    return {**point, "status": status.value, "reason": reason}


def rescore(result: dict[str, Any]) -> dict[str, Any]:
    """`result` (one results file as a dict) with its points, summary and verdict re-gated."""
    if result["status"] != "ok":
        return result
    quantization = result.get("quantization", "")
    points = [_rescore_point(p, result["dtype"], quantization) for p in result["points"]]
    counts = Counter(p["status"] for p in points)
    summary = {k: counts.get(k, 0) for k in ("pass", "warn", "fail", "n/a")}
    statuses = [Status(p["status"]) for p in points]
    return {**result, "points": points, "summary": summary, "verdict": verdict(statuses)}


def rescore_all(root: Path | None = None) -> list[tuple[str, str, str, str]]:
    """Rewrite every results file under `root` with the current gates; returns the cells whose
    verdict changed as (model, engine, old, new)."""
    changed = []
    for result in load_results(root):
        new = rescore(result)
        if new != result:
            write_result(ValidatorResult.model_validate(new), root)
        if new["verdict"] != result["verdict"]:
            changed.append((result["hf_id"], result["engine"], result["verdict"], new["verdict"]))
    return changed
