"""`gptforge launch [--nproc-per-node N] [multi-node options] COMMAND ...`: run a gptforge command
under torchrun (torch.distributed.run), printing the exact command line first; the command line
and its environment come from `gptforge.runtime.launch`."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from gptforge.options import command_parser, parse_command
from gptforge.runtime.launch import LaunchOptions, launch_env, torchrun_command

# One description: `gptforge --help` lists SUMMARY (read from this file unimported); DESCRIPTION begins with it.
SUMMARY = "Start N processes per node with torchrun, each running `gptforge COMMAND ...`."

DESCRIPTION = SUMMARY + """

One node:      gptforge launch --nproc-per-node 8 pretrain --data DIR --out RUN --parallel.dp_shard 8
Several nodes: run on every node, with the same --rdzv-endpoint (host:port of one of them):
               gptforge launch --nnodes 4 --nproc-per-node 8 --rdzv-endpoint node0:29500 --rdzv-id job1 pretrain ...
On Slurm, `gptforge slurm` writes the batch script that does this. The command is printed before
it runs, so it can be copied into a script of your own. launch's own options count wherever they
stand (`gptforge launch pretrain ... --dry-run` only prints); everything after a `--` goes to
the command unread."""


def build_parser():
    return command_parser("gptforge launch", DESCRIPTION, LaunchOptions, positional=("command",))


def split_launch_options(parser, argv: list[str]) -> LaunchOptions:
    """Parse `argv`, taking launch's own options wherever they stand, up to a `--`.

    Without this, an option after the command name (`launch pretrain ... --dry-run`) went to
    the command, and a dry run started real processes. Tokens after the first `--` belong to
    the command verbatim (for an option of the command that shares a name with launch's).

    Returns the namespace with `command` the gptforge command and its own arguments.
    Raises SystemExit(2), after a `gptforge launch: error:` line, for a launch option missing its value.
    """
    takes_value = {}
    for action in parser._actions:  # argparse's own table of the options (jsonargparse keeps it)
        for opt in action.option_strings:
            if opt not in ("-h", "--help"):
                takes_value[opt] = action.nargs != 0
    own: list[str] = []
    command: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            command += argv[i + 1:]
            break
        name = tok.split("=", 1)[0]
        if name in takes_value:
            own.append(tok)
            if takes_value[name] and "=" not in tok:
                if i + 1 >= len(argv):
                    print(f"gptforge launch: error: argument {name}: expected a value", file=sys.stderr)
                    raise SystemExit(2)
                own.append(argv[i + 1])
                i += 1
        elif tok in ("-h", "--help") and not command:
            own.append(tok)
        else:
            command.append(tok)
        i += 1
    args, _ = parse_command(parser, own)
    args.command = command
    return args


def main(argv: list[str]) -> int:
    from gptforge.cli import check_command

    args = split_launch_options(build_parser(), argv)
    check_command(args.command[1:] if args.command[:1] == ["--"] else args.command, "launch")
    cmd = torchrun_command(args)
    print(shlex.join(cmd), flush=True)
    if args.dry_run:
        return 0
    return subprocess.call(cmd, env=launch_env(args, os.environ))
