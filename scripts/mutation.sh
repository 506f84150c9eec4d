#!/usr/bin/env bash
# Mutation testing of the modules where a silent error is a wrong number, each package against its
# fast unit tests (no engine), with mutmut from PyPI brought in for the run only (not in uv.lock).
# mutmut works per project directory, so each package is its own run; configuration: the
# `[tool.mutmut]` table in packages/<package>/pyproject.toml. scripts/mutation_fresh.py (a pytest
# plugin) empties module-level caches in each mutant's run. Niced, one package at a time, since the
# machine is shared. Writes the report of every package run so far to docs/notes/mutation.md
# (each package's summary kept in docs/notes/mutation.json).
#
#   scripts/mutation.sh                      # every package (resumes from packages/*/mutants/)
#   scripts/mutation.sh ie-vllm ie-static    # some; the report keeps the others' last results
#   scripts/mutation.sh --fresh ...          # discard earlier results first
#   scripts/mutation.sh --survivors ...      # rerun only the mutants not killed (after new tests)
#   MUTMUT_CHILDREN=1 scripts/mutation.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
mode=resume
if [[ "${1:-}" == "--fresh" || "${1:-}" == "--survivors" ]]; then mode="${1#--}"; shift; fi
packages=("$@")
if [[ ${#packages[@]} -eq 0 ]]; then packages=(ie-core ie-vllm ie-static ie-eager); fi
mutmut=(uv run --locked --with mutmut==3.8.1 mutmut)
export PYTHONPATH="$root/scripts${PYTHONPATH:+:$PYTHONPATH}"  # finds the mutation_fresh plugin
# mutmut forks each mutant's run from a process that already ran the tests. Once torch has run an
# OpenMP parallel region there (ie-eager's synthetic models are big enough to), a forked child
# waits forever at its first parallel region for threads it does not have (libgomp is not
# fork-safe), and the wait ends as a "timeout", which mutmut counts as killed. One thread each.
export OMP_NUM_THREADS=1

run_package() {
  local names=() seconds_file=mutants/seconds.txt
  if [[ $mode == fresh ]]; then rm -rf mutants; fi
  if [[ $mode == survivors ]]; then
    # The report counts a mutant left "not checked" after a survivors rerun as killed in the full
    # run, so the full run must have finished.
    if grep -q ': not checked$' mutants/results.txt; then
      echo "$package: its last run stopped before every mutant ran; resume it first" >&2
      exit 1
    fi
    mapfile -t names < <(grep -v -E ': (killed|timeout)$' mutants/results.txt | cut -d: -f1 | tr -d ' ')
    seconds_file=mutants/rerun_seconds.txt
    if [[ ${#names[@]} -eq 0 ]]; then echo 0 > "$seconds_file"; return; fi
  fi
  mkdir -p mutants
  local start
  start=$(date +%s)
  if ! nice -n 19 "${mutmut[@]}" run --max-children "${MUTMUT_CHILDREN:-2}" "${names[@]}" \
    > mutants/run.log 2>&1; then
    tail -n 30 mutants/run.log
    exit 1
  fi
  echo $(( $(date +%s) - start )) > "$seconds_file"
  if [[ $mode != survivors ]]; then rm -f mutants/rerun_seconds.txt mutants/named_rerun_seconds.txt; fi
  "${mutmut[@]}" results --all true > mutants/results.txt
}

for package in "${packages[@]}"; do
  cd "$root/packages/$package"
  run_package
  echo "$package: $(cat mutants/seconds.txt)s"
done
cd "$root"
# The packages run now update docs/notes/mutation.json; the others keep their last results there.
uv run --locked python scripts/mutation_report.py "${packages[@]/#/packages/}" > docs/notes/mutation.md
echo "wrote docs/notes/mutation.md"
