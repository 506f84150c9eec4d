"""`ie atlas`: every dictionary feature's top activations, counts, histogram and band samples over
a corpus, as an exact streaming state that merges across shards (docs/HARVEST.md, "Atlas")."""

from ie_core.atlas.errors import AtlasError, AtlasMismatchError
from ie_core.atlas.merging import merge_atlases
from ie_core.atlas.reader import AtlasData, open_atlas
from ie_core.atlas.running import AtlasResult, atlas
from ie_core.atlas.state import AtlasState, Binning, from_rows, merge, update

__all__ = [
    "AtlasData",
    "AtlasError",
    "AtlasMismatchError",
    "AtlasResult",
    "AtlasState",
    "Binning",
    "atlas",
    "from_rows",
    "merge",
    "merge_atlases",
    "open_atlas",
    "update",
]
