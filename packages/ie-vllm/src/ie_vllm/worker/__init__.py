"""vLLM's worker processes: the worker extension, point resolution on vLLM's modules, hooks, batch layout, the row store and in-worker reductions."""
