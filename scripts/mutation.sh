#!/usr/bin/env bash
# Mutation testing of ie-core's numeric modules (steer_math, spec_values, ragged, wire,
# feature_ops, sae_math) against their fast unit tests, with mutmut from PyPI brought in for the
# run only (not in uv.lock). Configuration: [tool.mutmut] in packages/ie-core/pyproject.toml.
# Niced, since the machine is shared. Writes the per-module report to docs/notes/mutation.md.
#
#   scripts/mutation.sh            # run (resumes an interrupted run from packages/ie-core/mutants/)
#   scripts/mutation.sh --fresh    # discard earlier results first
#   MUTMUT_CHILDREN=1 scripts/mutation.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root/packages/ie-core"
if [[ "${1:-}" == "--fresh" ]]; then rm -rf mutants; fi
start=$(date +%s)
nice -n 10 uv run --locked --with mutmut==3.8.1 mutmut run --max-children "${MUTMUT_CHILDREN:-2}" \
  > /dev/null
seconds=$(( $(date +%s) - start ))
uv run --locked --with mutmut==3.8.1 mutmut results --all true > mutants/results.txt
uv run --locked python "$root/scripts/mutation_report.py" mutants mutants/results.txt "$seconds" \
  > "$root/docs/notes/mutation.md"
echo "wrote docs/notes/mutation.md (${seconds}s)"
