"""Other model formats (the Hugging Face writer lives in gptforge.model.hf_save)."""
