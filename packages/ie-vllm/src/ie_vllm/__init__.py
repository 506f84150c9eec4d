from importlib.metadata import version

__version__ = version("ie-vllm")  # one source: the installed distribution's metadata

__all__ = ["__version__"]
