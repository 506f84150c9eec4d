"""The command line and what it writes: `ie` and its subcommands, the capability sweeps, the
generated docs and records, benchmark load, progress bars. Each module declares its own
`__all__`; import from the module."""

__all__: list[str] = []
