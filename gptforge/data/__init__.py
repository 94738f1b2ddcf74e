"""Readers, normalization, filters, dedup, tokenizer, shard packing, loader, pipeline report."""
