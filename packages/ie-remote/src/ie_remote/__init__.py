"""Backend `remote`: `load_model("http://host:port", backend="remote")` against `ie serve`."""

from importlib.metadata import version

from ie_remote.backend import RemoteError, RemoteModel, load

__version__ = version("ie-remote")  # one source: the installed distribution's metadata

__all__ = ["RemoteError", "RemoteModel", "__version__", "load"]
