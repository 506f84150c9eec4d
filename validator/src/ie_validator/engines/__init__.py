"""Engine adapters: each captures a list of canonical requests on one model and returns arrays in
canonical layout, or a `Gap` saying why it cannot."""
