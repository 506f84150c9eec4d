"""`ie atlas`: every dictionary feature's top activations, counts, histogram and band samples over
a corpus, as an exact streaming state that merges across shards (docs/HARVEST.md)."""

from ie_core.atlas.state import AtlasState, Binning, from_rows, merge, update

__all__ = ["AtlasState", "Binning", "from_rows", "merge", "update"]
