"""Scripts that run inside a peer engine's own environment (they import nothing from this project)."""
