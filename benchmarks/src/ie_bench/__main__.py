"""`python -m ie_bench ...`, the same as `ie bench ...` (the sweep starts cells this way)."""

import sys

from ie_bench.cli import bench_command

if __name__ == "__main__":
    raise SystemExit(bench_command(sys.argv[1:]))
