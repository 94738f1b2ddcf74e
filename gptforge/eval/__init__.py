"""Evaluation: loss, perplexity and bits per byte over token windows and text."""
