"""`ie dashboard atlas FOLDER`: a finished `ie atlas` folder into the database, one row per feature.

Reading the folder needs ie-core's atlas reader (torch and safetensors: `ie-core[harvest]`), so
only the command imports this module; the app reads the rows it writes (`atlas_pages.py`).
Tokens are decoded once here (the atlas's model's tokenizer), so the pages need no tokenizer.
Each context is kept as the tokens around its peak (`BEFORE` / `AFTER`); the folder keeps the
whole window. The same folder imported twice is one atlas (`keys.atlas_key`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ie_core.grammar import to_address
from sqlmodel import Session, select

from ie_dashboard.keys import atlas_key
from ie_dashboard.tables import AtlasFeatureRow, AtlasRow

__all__ = ["AFTER", "BEFORE", "AtlasImportError", "import_atlas", "token_decoder"]

BEFORE, AFTER = 24, 8  # tokens shown before and after a context's peak
_CHUNK = 2_000  # feature rows per INSERT
_SCAN = re.compile(r"^scan:\s*['\"]?([^'\"\n]+?)['\"]?\s*$", re.MULTILINE)

Decode = Callable[[int], str]


class AtlasImportError(ValueError):
    """The folder is not a finished atlas (the message says why and what to run)."""


def token_decoder(model: str) -> Decode:
    """One token id to its text with `model`'s tokenizer (its folder on this machine)."""
    from ie_core.models import resolve_model_path

    folder = resolve_model_path(model) if model else None
    if folder is None:
        raise AtlasImportError(
            f"the tokenizer of {model!r} is not on this machine; pass --tokenizer with a model "
            "folder (the pages show decoded tokens)"
        )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return lambda token: tokenizer.decode([token])


def _cached(decode: Decode) -> Decode:
    seen: dict[int, str] = {}

    def one(token: int) -> str:
        text = seen.get(token)
        if text is None:
            text = seen[token] = decode(token)
        return text

    return one


def _context(context: dict[str, Any], decode: Decode) -> dict[str, Any]:
    pos = int(context["position"])
    start = max(0, pos - BEFORE)
    stop = min(len(context["tokens"]), pos + AFTER + 1)
    return {
        "sequence": int(context["sequence"]), "position": pos, "value": float(context["value"]),
        "start": start, "tokens": [decode(int(t)) for t in context["tokens"][start:stop]],
        "acts": [float(a) for a in context["acts"][start:stop]],
    }  # fmt: skip


def _band_ranges(binning: Any) -> list[tuple[float, float | None]]:
    """Each band's activation range; the last is open above (2**high and up)."""
    inner = [(2.0 ** (binning.low + b), 2.0 ** (binning.low + b + 1)) for b in range(binning.bands - 2)]  # fmt: skip
    return [(0.0, 2.0**binning.low), *inner, (2.0**binning.high, None)]


def feature_page(page: dict[str, Any], decode: Decode, bands: list[Any]) -> dict[str, Any]:
    """What the feature page shows, from `AtlasData.feature(f)`: plain JSON, tokens decoded."""
    out: dict[str, Any] = {
        "histogram": page["histogram"],
        "top": [_context(c, decode) for c in page["top"]],
        "bands": [
            {"low": low, "high": high, "contexts": [_context(c, decode) for c in contexts]}
            for (low, high), contexts in zip(bands, page["bands"], strict=True)
            if contexts
        ],
    }
    for side in ("top", "bottom"):
        pairs = page.get(f"{side}_logits", [])
        out[f"{side}_logits"] = [[decode(int(t)), float(v)] for t, v in pairs]
    return out


def _feature_rows(data: Any, atlas_id: int, decode: Decode) -> Iterator[dict[str, Any]]:
    bands = _band_ranges(data.state.binning)
    for f in range(data.d_sae):
        page = data.feature(f)
        shown = feature_page(page, decode, bands)
        top = shown["top"][0] if shown["top"] else None
        token = top["tokens"][top["position"] - top["start"]] if top else ""
        yield {
            "atlas_id": atlas_id, "feature": f, "fired": int(page["count"]),
            "density": float(page["density"]), "max_act": float(page["max"]),
            "mean_act": float(page["mean"]), "top_token": token,
            "token_key": token_key(token),
            "page_json": json.dumps(shown, allow_nan=False, separators=(",", ":")),
        }  # fmt: skip


def token_key(text: str) -> str:
    """What the index's token search compares: the token stripped and case-folded."""
    return text.strip().casefold()


def scan_of(dictionary: dict[str, Any]) -> str:
    """The name a graph of this dictionary's transcoder set carries in `metadata.scan`: the set's
    config.yaml `scan`, else its folder's name (as `load_transcoders` names it)."""
    source = dictionary.get("source")
    if not source:
        return str(dictionary.get("name") or "")
    path = Path(source)
    folder = path.parent if path.is_file() or path.suffix == ".safetensors" else path
    config = folder / "config.yaml"
    if config.is_file():
        found = _SCAN.search(config.read_text(errors="replace"))
        if found:
            return found.group(1).strip()
    return folder.name


def _open(folder: Path) -> Any:
    try:
        from ie_core.atlas import AtlasError, open_atlas
    except ImportError as exc:
        raise AtlasImportError(
            f"reading an atlas needs torch and safetensors ({exc.name} is missing): install "
            "`ie-core[harvest]` beside the dashboard"
        ) from None
    try:
        return open_atlas(folder)
    except AtlasError as exc:
        raise AtlasImportError(str(exc)) from None


def import_atlas(
    session: Session, folder: str | Path, decode: Decode, *, scan: str | None = None
) -> tuple[int, bool]:
    """Store the finished atlas at `folder` (tokens decoded with `decode`) in this transaction:
    (atlas row id, True) when new, (id, False) when this folder was already imported."""
    folder = Path(folder)
    data = _open(folder)
    spec = data.manifest.spec
    dictionary = spec.get("dictionary") or {}
    model = str(spec.get("model") or "")
    digest = hashlib.sha256((folder / "state.safetensors").read_bytes()).hexdigest()
    key = atlas_key(model, str(dictionary.get("key") or ""), digest)
    found = session.exec(select(AtlasRow).where(AtlasRow.atlas_key == key)).first()
    if found is not None and found.id is not None:
        return found.id, False
    address = str(dictionary.get("address") or "")
    row = AtlasRow(
        atlas_key=key, name=str(dictionary.get("name") or folder.name), model=model,
        scan=scan if scan is not None else scan_of(dictionary),
        layer=to_address(address).layer if address else None, address=address,
        d_sae=data.d_sae, tokens=int(data.state.tokens), top_k=int(data.state.k),
        spec_json=json.dumps({"spec": spec, "info": data.manifest.info,
                             "bin_edges": data.state.binning.edges().tolist()}, sort_keys=True),
        source=str(folder), ingested_at=datetime.now(UTC).isoformat(),
    )  # fmt: skip
    session.add(row)
    session.flush()
    assert row.id is not None
    table = AtlasFeatureRow.__table__  # type: ignore[attr-defined]
    chunk: list[dict[str, Any]] = []
    for values in _feature_rows(data, row.id, _cached(decode)):
        chunk.append(values)
        if len(chunk) == _CHUNK:
            session.connection().execute(table.insert(), chunk)
            chunk = []
    if chunk:
        session.connection().execute(table.insert(), chunk)
    return row.id, True
