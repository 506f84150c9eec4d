"""Experiments built on the protocol: patching sweeps, user hooks, the lens and its
stream, dictionaries (SAEs, transcoders) and their read-out, splicing, ragged batches, chat
analysis. Each module declares its own `__all__`; import from the module."""

__all__: list[str] = []
