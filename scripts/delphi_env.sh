#!/usr/bin/env bash
# The environment `packages/ie-core/tests/test_atlas_delphi.py` loads an `ie atlas delphi` export
# in: the released eai-delphi 0.1.3 in its own virtual environment, with the dependencies its
# latent loader imports (`delphi.latents`, `delphi.config`). delphi's full dependency list adds
# vLLM and CUDA wheels it does not need to read a cache, so the package goes in with --no-deps and
# its loader's imports are listed here (torch and transformers pinned to the workspace's, which
# uv links from its cache).
#
#   scripts/delphi_env.sh [ENV]   # default: $IE_DELPHI_ENV, else ~/.cache/interp-engine/delphi-0.1.3
set -euo pipefail
ENV="${1:-${IE_DELPHI_ENV:-$HOME/.cache/interp-engine/delphi-0.1.3}}"
uv venv --python "${DELPHI_PYTHON:-3.11}" "$ENV.tmp"
uv pip install --python "$ENV.tmp" --no-deps eai-delphi==0.1.3
uv pip install --python "$ENV.tmp" torch==2.13.0 transformers==5.19.0 numpy safetensors \
  jaxtyping orjson blobfile asyncer simple_parsing faiss-cpu sentence-transformers beartype fire
rm -rf "$ENV"
mv "$ENV.tmp" "$ENV"
# A venv records its own path; moving it leaves the interpreter working (the tests call it by path).
echo "$ENV"
