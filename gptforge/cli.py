"""`gptforge <command>`: one entry point; each command parses its config and calls into a stage.

Each command is a module `gptforge/commands/<name>.py` with `main(argv) -> int`, imported only
when run, so that `gptforge --help` stays fast.
"""

from __future__ import annotations

import sys

COMMANDS = {
    "quickstart": "Build a corpus from the Python standard library, train a small GPT on the CPU, evaluate, sample.",
    "plan": "Predict per-GPU memory, speed, time and cost of a training job (and check it on fake tensors).",
    "prepare": "Read raw text (txt/md/jsonl/json/parquet, plain or compressed), train/load a tokenizer, write token shards.",
    "pretrain": "Train a GPT from scratch on prepared shards.",
    "evaluate": "Loss, perplexity and bits per byte of a run or checkpoint on a split or a text file.",
    "generate": "Sample text from a run or checkpoint with a KV cache.",
    "finetune": "Fine-tune a Hugging Face or gptforge model (full or LoRA) on instruction .jsonl or shards.",
    "convert": "Convert Hugging Face model folders (GPT-2, Llama, Mistral, Qwen2) to gptforge checkpoints and back.",
    "launch": "Run a gptforge command under torchrun on N processes (and nodes), printing the command.",
    "slurm": "Write a Slurm sbatch script that runs a gptforge command with torchrun on N nodes x G GPUs.",
    "export-checkpoint": "Consolidate a sharded training checkpoint into one safetensors (or torch) file.",
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: gptforge <command> [options]   (gptforge <command> --help for its options)", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, text in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch `gptforge <command> ...`. Returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from gptforge import __version__

        print(f"gptforge {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(f"gptforge: unknown command {name!r}{hint}\n\n{_usage()}", file=sys.stderr)
        return 2
    import importlib

    module = importlib.import_module(f"gptforge.commands.{name.replace('-', '_')}")
    try:
        return module.main(rest) or 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
