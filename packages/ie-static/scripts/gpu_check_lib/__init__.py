"""The parts of `gpu_check.py`: the plan (pure data), facts about the machine, the parity half and
the priced columns. `gpu_check.py` is the entry point; nothing here is run on its own."""
