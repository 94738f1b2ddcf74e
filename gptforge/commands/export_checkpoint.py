"""`gptforge export-checkpoint RUN_DIR_or_CHECKPOINT --out FILE`: one consolidated file from a
sharded (DCP) training checkpoint, on the CPU of one machine; written by
`gptforge.export.consolidate`, where the options (`ExportCheckpointOptions`) live."""

from __future__ import annotations

from gptforge.export.consolidate import ExportCheckpointOptions
from gptforge.options import command_parser, parse_command

# One description: `gptforge --help` lists SUMMARY (read from this file unimported); DESCRIPTION begins with it.
SUMMARY = "Consolidate a sharded training checkpoint into one safetensors (or torch) file."

DESCRIPTION = SUMMARY + """

Write one consolidated model file from a training checkpoint, whatever layout and
number of ranks wrote it. Runs in one process on the CPU: it needs the model's size in RAM, not
the GPUs that trained it.

  --format safetensors (default): model weights only, full tensors, named as in the GPT module;
      the resolved model config is stored in the file's metadata (key gptforge_model_config).
  --format torch: everything in the checkpoint (model and optimizer states) as one torch.save
      file, through torch.distributed.checkpoint.format_utils.dcp_to_torch_save."""


def build_parser():
    return command_parser("gptforge export-checkpoint", DESCRIPTION, ExportCheckpointOptions,
                          positional=("checkpoint",))


def main(argv: list[str]) -> int:
    args, _ = parse_command(build_parser(), argv)
    from gptforge.export.consolidate import export_checkpoint

    ckpt, summary = export_checkpoint(args)
    extra = f", {summary['tensors']} tensors, {summary['parameters']:,} values" if "tensors" in summary else ""
    print(f"wrote {args.out} from {ckpt} ({summary['format']}{extra}, {summary['bytes']:,} bytes)")
    return 0
