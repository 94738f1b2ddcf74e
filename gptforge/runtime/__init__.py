"""What training, evaluation and inference share, without the trainer.

- `device`: device choice (`pick_device`) and autocast for a precision name.
- `loss`: the next-token loss summed over counted targets, and micro-batch unpacking.
- `checkpoint`: the checkpoint format (DCP folders, `latest`/`best` pointers, trainer state).
- `adapters`: reading LoRA / QLoRA adapters out of a checkpoint and merging them.
- `loading`: the model-loading API: a checkpoint or a Hugging Face folder -> GPT, and back.
- `activation`: activation checkpointing of a model's blocks.
"""
