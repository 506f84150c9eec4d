from importlib.metadata import version

__version__ = version("ie-validator")  # one source: the installed distribution's metadata

__all__ = ["__version__"]
