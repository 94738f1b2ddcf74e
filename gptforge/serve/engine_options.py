"""The server's engine features (prefix reuse, n-gram speculation): the `Engine` keyword arguments a
`ServeConfig` asks for, and their Prometheus metrics."""

from __future__ import annotations

from typing import Any


def engine_options(cfg: Any) -> dict:
    """Keyword arguments of `gptforge.infer.engine.Engine` from a `ServeConfig`'s prefix_caching,
    prefix_cache_slots, speculative, num_speculative_tokens and compile_decode."""
    return {"prefix_caching": cfg.prefix_caching, "prefix_cache_slots": cfg.prefix_cache_slots,
            "speculative": cfg.speculative, "num_speculative_tokens": cfg.num_speculative_tokens,
            "compile_decode": cfg.compile_decode}


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def add_engine_metrics(registry, engine) -> None:
    """Gauges over `engine.stats` (an `EngineStats`, cumulative since the engine started; an engine
    process refreshes its copy every step):

    gptforge_prefix_cache_query_tokens / _hit_tokens: prompt tokens admitted, and those whose prefill a
    reused prefix skipped; gptforge_prefix_cache_hit_rate: hit / query (0 before any prompt).
    gptforge_spec_decode_draft_tokens / _accepted_tokens: n-gram draft tokens verified and accepted;
    gptforge_spec_decode_acceptance_rate: accepted / draft (0 before any draft).
    """
    from prometheus_client import Gauge

    def gauge(name: str, doc: str, read) -> None:
        Gauge(name, doc, registry=registry).set_function(lambda: float(read(engine.stats)))

    gauge("gptforge_prefix_cache_query_tokens", "Prompt tokens admitted (prefix reuse looked them up)",
          lambda s: s.prefix_query_tokens)
    gauge("gptforge_prefix_cache_hit_tokens", "Prompt tokens whose prefill a cached prefix skipped",
          lambda s: s.prefix_hit_tokens)
    gauge("gptforge_prefix_cache_hit_rate", "Prefix cache hit tokens / query tokens",
          lambda s: _ratio(s.prefix_hit_tokens, s.prefix_query_tokens))
    gauge("gptforge_spec_decode_draft_tokens", "n-gram draft tokens verified", lambda s: s.spec_draft_tokens)
    gauge("gptforge_spec_decode_accepted_tokens", "n-gram draft tokens accepted", lambda s: s.spec_accepted_tokens)
    gauge("gptforge_spec_decode_acceptance_rate", "Accepted / verified draft tokens",
          lambda s: _ratio(s.spec_accepted_tokens, s.spec_draft_tokens))
