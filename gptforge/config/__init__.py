"""Typed configuration: plain dataclasses are the single source of truth.

A YAML recipe (`--config recipe.yaml`) and dotted command-line overrides (`--train.lr 3e-4`) fill
them through jsonargparse (`gptforge.options.command_parser`), so each field's docstring is its `--help` text. Unknown keys are errors
that name the key and its nearest valid spelling (see `parse`).

`ModelConfig` fields default to None, meaning "take it from the preset, else the default": that
is how `--model.preset gpt2-small --model.n_layer 6` can mean "gpt2-small with 6 layers". Call
`ModelConfig.resolved()` to get a config with every field filled.

Sections live in their own modules (`model`, `train`, `parallel`, `run`; dict conversion in
`dicts`); every public name is importable from `gptforge.config`.
"""

from gptforge.config.dicts import from_dict, to_dict
from gptforge.config.model import ModelConfig, check_preset
from gptforge.config.parallel import Offload, ParallelConfig
from gptforge.config.rl import RLConfig
from gptforge.config.run import SECTIONS, RunConfig, describe_parse_error, explain_unknown, run_config_from
from gptforge.config.train import Checkpointing, FinetuneConfig, OptimizerName, Precision, TrainConfig

__all__ = ["Checkpointing", "FinetuneConfig", "ModelConfig", "Offload", "OptimizerName", "ParallelConfig", "Precision", "RLConfig", "RunConfig", "SECTIONS", "TrainConfig",
           "check_preset", "describe_parse_error", "explain_unknown", "from_dict", "run_config_from", "to_dict"]
