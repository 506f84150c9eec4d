"""The dashboard installs and runs with ie-core alone: importing and building the app never loads torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
from fastapi.testclient import TestClient
import ie_dashboard.app, ie_dashboard.cli, ie_dashboard.export
app = ie_dashboard.app.create_app(sys.argv[1], token=None)
with TestClient(app) as c:
    for url in ("/", "/?arch=gemma2&point=attn_scores.1", "/throughput", "/validation", "/api/architectures"):
        assert c.get(url).status_code == 200, url
heavy = sorted(m for m in ("torch", "transformers", "vllm", "numpy") if m in sys.modules)
print(",".join(heavy))
"""


def test_app_does_not_import_torch(tmp_path: Path) -> None:
    # A fresh interpreter: this test process may have imported torch through other packages' tests.
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "d.sqlite")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "torch" not in out.stdout.strip().split(","), out.stdout
    assert out.stdout.strip() == "", f"heavy modules imported: {out.stdout}"
