"""The OpenAI-compatible HTTP server (`gptforge serve`): FastAPI routes over the continuous-batching engine."""
