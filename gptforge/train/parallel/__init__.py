"""Parallel layouts applied to the model from outside: process groups, DDP, FSDP2, tensor and
pipeline parallel, the DeepSpeed engine and its config."""
