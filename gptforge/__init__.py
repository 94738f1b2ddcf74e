"""gptforge: raw text -> tokenizer -> trained GPT -> evaluation -> generated text, with one tool."""

__version__ = "0.1.0"
