"""Hugging Face, ONNX and GGUF writers; quantize, prune, distill."""
