"""The GPT module (GPT-2 and Llama-style blocks) and named presets."""

from gptforge.model.gpt import GPT, KVCache, flops_per_token
from gptforge.model.presets import PRESETS

__all__ = ["GPT", "KVCache", "PRESETS", "flops_per_token"]
