"""Memory, FLOPs and time model; hardware table; layout search."""
