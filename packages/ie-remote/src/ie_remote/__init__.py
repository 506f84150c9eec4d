"""Backend `remote`: `load_model("http://host:port", backend="remote")` against `ie serve`."""

from ie_remote.backend import RemoteError, RemoteModel, load

__all__ = ["RemoteError", "RemoteModel", "load"]
