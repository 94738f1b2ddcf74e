"""Generation with a KV cache (temperature, top-k, top-p sampling)."""
