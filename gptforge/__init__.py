"""gptforge: raw text -> tokenizer -> trained GPT -> evaluation -> generated text, with one tool.

Packages form layers, bottom to top; a module imports only from its own layer or those below it,
and nothing imports `gptforge.commands` (the CLI loads a command by name):

    base      gptforge (this file), atomic, config, presets, errors, progress, ranges, options
    model     the GPT module, LoRA / 4-bit layers, Hugging Face tensor mapping and writing
    runtime   device and autocast, loss helpers, the checkpoint format, model loading, torchrun and Slurm launch
    data      readers, curation, tokenizer, token shards, batches
    plan      memory / FLOPs / time model, hardware table, layout search
    infer     generation
    eval      perplexity and task evaluation
    report    run reports
    train     the loop and its components; parallel/ layouts; workflows/ (fine-tuning, distillation, sweeps)
    export    other model formats, compression
    serve     the HTTP server
    commands  `gptforge <command>` (gptforge.cli, gptforge.commands.*, gptforge.quickstart)

`tests/test_layers.py` parses every module's imports and fails on an edge against this order, and on
a module this table does not place (a base module named in no row, a package named in no row).
"""

__version__ = "0.1.0"
