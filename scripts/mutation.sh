#!/usr/bin/env bash
# Mutation testing of the modules where a silent error is a wrong number, each package against its
# fast unit tests (no engine), with mutmut from PyPI brought in for the run only (not in uv.lock).
# mutmut works per project directory, so each package is its own run; configuration: the
# `[tool.mutmut]` table in packages/<package>/pyproject.toml. scripts/mutation_fresh.py (a pytest
# plugin) empties module-level caches in each mutant's run. Niced, one package at a time, since the
# machine is shared. Writes the report of every package run so far to docs/notes/mutation.md.
#
#   scripts/mutation.sh                      # every package (resumes from packages/*/mutants/)
#   scripts/mutation.sh ie-vllm ie-static    # some; the report keeps the others' last results
#   scripts/mutation.sh --fresh ...          # discard earlier results first
#   MUTMUT_CHILDREN=1 scripts/mutation.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
fresh=0
if [[ "${1:-}" == "--fresh" ]]; then fresh=1; shift; fi
packages=("$@")
if [[ ${#packages[@]} -eq 0 ]]; then packages=(ie-core ie-vllm ie-static ie-eager); fi
mutmut=(uv run --locked --with mutmut==3.8.1 mutmut)
export PYTHONPATH="$root/scripts${PYTHONPATH:+:$PYTHONPATH}"  # finds the mutation_fresh plugin
for package in "${packages[@]}"; do
  cd "$root/packages/$package"
  if [[ $fresh == 1 ]]; then rm -rf mutants; fi
  start=$(date +%s)
  mkdir -p mutants
  if ! nice -n 19 "${mutmut[@]}" run --max-children "${MUTMUT_CHILDREN:-2}" > mutants/run.log 2>&1; then
    tail -n 30 mutants/run.log
    exit 1
  fi
  echo $(( $(date +%s) - start )) > mutants/seconds.txt
  "${mutmut[@]}" results --all true > mutants/results.txt
  echo "$package: $(cat mutants/seconds.txt)s"
done
cd "$root"
done_packages=()
for d in packages/*/mutants/results.txt; do done_packages+=("$(dirname "$(dirname "$d")")"); done
uv run --locked python scripts/mutation_report.py "${done_packages[@]}" > docs/notes/mutation.md
echo "wrote docs/notes/mutation.md"
