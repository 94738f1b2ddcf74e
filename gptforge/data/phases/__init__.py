"""The phases of `gptforge prepare`, one module each, in run order (`gptforge.data.prepare` drives them).

- `work`: `WorkFolder`, the work folder's paths, done markers and atomic writes;
- `pool`: the worker processes every phase's per-shard tasks run in (the `Executor` protocol);
- `ray_executor`: the same tasks as Ray tasks on a cluster (`--executor ray`);
- `curate`: read and curate (per-document steps, corpus steps' key passes and verdicts);
- `split`: each document's split;
- `tokenizer`: the tokenizer's training sample and training;
- `encode`: tokenization per shard and split;
- `write`: the shard folder and its report.
"""
