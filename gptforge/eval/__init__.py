"""Perplexity / bits per byte, multiple choice, lm-eval adapter."""
