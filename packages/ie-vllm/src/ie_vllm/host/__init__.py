"""The host process: the model object, its admission checks, the engine client and the request flow (what runs in the user's Python process)."""
