"""The training loop and its components (top level), parallelism (`parallel/`) and the
workflows built on the loop (`workflows/`: fine-tuning, distillation, sweeps, sanity check)."""
