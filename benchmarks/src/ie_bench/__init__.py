"""interp-engine's speed harness: one `(model, variant)` cell per process, a report, publishing.

The spec (`ie_bench.spec`) is plain data; nothing here imports torch until a cell runs.
"""

from importlib.metadata import version

__version__ = version("ie-bench")  # one source: the installed distribution's metadata

__all__ = ["__version__"]
