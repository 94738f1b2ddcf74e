"""The GPT module (GPT-2 and Llama-style blocks), LoRA / 4-bit layers, Hugging Face mapping."""

from gptforge.model.gpt import GPT, KVCache

__all__ = ["GPT", "KVCache"]
