"""interp-engine dashboard: the points cheat sheet, throughput cards and the validation matrix.

FastAPI + Jinja2 + htmx over SQLModel (SQLite by default). Imports ie-core only, never torch.
"""

from importlib.metadata import version


def __getattr__(name: str):  # lazy, so `import ie_dashboard` stays cheap for the CLI
    if name == "create_app":
        from ie_dashboard.app import create_app

        return create_app
    raise AttributeError(name)


__version__ = version("ie-dashboard")  # one source: the installed distribution's metadata

__all__ = ["__version__"]
