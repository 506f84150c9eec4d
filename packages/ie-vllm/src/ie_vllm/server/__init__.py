"""`ie serve`: vLLM's own API server with the /v1/ie routes, the steering middleware, request limits and the served dictionaries."""
