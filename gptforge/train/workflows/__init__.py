"""Workflows built on the training loop: fine-tuning (full, LoRA, QLoRA), distillation, size
sweeps and the sanity overfit check."""
