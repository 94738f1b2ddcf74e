"""Generation with a KV cache; OpenAI-compatible server."""
