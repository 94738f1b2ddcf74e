"""Start-up time of `gptforge generate` and `gptforge evaluate` against `python -c 'import torch'`.

A short command's time is mostly start-up: this measures the wall and CPU time (user + system) of
each command on a tiny run (trained here, 2 steps), in --repeats rounds that each run every
command once (so that all see the same load on a shared machine), and prints the medians and how
much each takes beyond importing torch in the same round (target: within about 1.5 s). It then runs generate once under `python -X importtime` and
prints the cumulative import time of torch and of the heavy packages inference can do without
(torch.distributed.checkpoint, sympy, torch._dynamo), and the same for a copy of the run whose
checkpoint has no model.safetensors (the DCP path).

--write-cost also saves a checkpoint of a larger model (--write-params parameters, AdamW states
included) with and without the consolidated model.safetensors and prints the extra seconds and
bytes.

    python bench/startup_time.py [--repeats 5] [--write-cost]   (--repeats 0: the write cost alone)

Run it from the checkout to measure: `python -m gptforge.cli` finds gptforge in the current
directory first.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_description  # bench/machine.py

HEAVY = ("torch", "torch.distributed.checkpoint", "sympy", "torch._dynamo", "transformers")


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one run of `cmd`."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    return time.perf_counter() - t0, usage.ru_utime + usage.ru_stime


def rounds(cmds: dict[str, list[str]], repeats: int) -> dict[str, tuple[float, float, float, float]]:
    """Run every command once per round, `repeats` rounds, so that all see the same load.

    Returns name -> (median wall s, median CPU s, median wall beyond the round's first command,
    median CPU beyond it): the differences are paired within a round.
    """
    runs = {name: [] for name in cmds}
    for _ in range(repeats):
        for name, cmd in cmds.items():
            runs[name].append(timed(cmd))
    first = next(iter(cmds))
    med = statistics.median
    return {name: (med(w for w, _ in r), med(c for _, c in r),
                   med(w - b[0] for (w, _), b in zip(r, runs[first], strict=True)),
                   med(c - b[1] for (_, c), b in zip(r, runs[first], strict=True))) for name, r in runs.items()}


def import_times(cmd: list[str]) -> dict[str, float]:
    """Cumulative `-X importtime` seconds of each HEAVY module the command imported."""
    res = subprocess.run([sys.executable, "-X", "importtime", *cmd], capture_output=True, text=True, check=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    out = {}
    for line in res.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cum, name = line.split("|")
            name = name.strip()
            if name in HEAVY and name not in out and cum.strip().isdigit():
                out[name] = int(cum) / 1e6
    return out


def write_cost(n_params: int) -> None:
    import torch

    from gptforge.config import ModelConfig
    from gptforge.model.gpt import GPT
    from gptforge.runtime.checkpoint import CONSOLIDATED_FILE, save_checkpoint

    d = 512
    layers = max(1, round((n_params - 8192 * d) / (12 * d * d)))
    model = GPT(ModelConfig(arch="gpt2", n_layer=layers, n_head=8, d_model=d, vocab_size=8192,
                            block_size=256).resolved())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.zeros(1, 8, dtype=torch.long)).float().mean().backward()
    opt.step()
    n = model.num_params()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for consolidated in (False, True, False, True):
            root = Path(tmp) / f"c{int(consolidated)}"
            shutil.rmtree(root, ignore_errors=True)
            t0 = time.perf_counter()
            step = save_checkpoint(root, 1, model, opt, {"step": 1}, "model: {}\n", consolidated=consolidated)
            secs = time.perf_counter() - t0
            total = sum(f.stat().st_size for f in step.iterdir() if f.is_file())
            extra = (step / CONSOLIDATED_FILE).stat().st_size if consolidated else 0
            rows.setdefault(consolidated, []).append((secs, total, extra))
    best = {k: min(v) for k, v in rows.items()}
    print(f"checkpoint write, {n / 1e6:.1f} M parameters fp32 with AdamW states (best of 2):")
    print(f"  DCP only             {best[False][0]:6.2f} s  {best[False][1] / 2**20:8.1f} MiB")
    print(f"  DCP + consolidated   {best[True][0]:6.2f} s  {best[True][1] / 2**20:8.1f} MiB "
          f"(model.safetensors {best[True][2] / 2**20:.1f} MiB, +{100 * best[True][2] / best[False][1]:.0f}% disk, "
          f"+{best[True][0] - best[False][0]:.2f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--write-cost", action="store_true", help="also measure the consolidated file's write cost")
    ap.add_argument("--write-params", type=int, default=25_000_000)
    args = ap.parse_args()
    if args.repeats > 0:
        startup(args.repeats)
    if args.write_cost:
        write_cost(args.write_params)


def startup(repeats: int) -> None:
    py = sys.executable
    cpu = cpu_description()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = Path(os.__file__).parent
        files = sorted(src.glob("*.py"))[:30]
        subprocess.run([py, "-m", "gptforge.cli", "prepare", *map(str, files), "--out", str(tmp / "d"),
                        "--vocab-size", "400", "--no-progress", "--workers", "1"], check=True, capture_output=True)
        subprocess.run([py, "-m", "gptforge.cli", "pretrain", "--data", str(tmp / "d"), "--out", str(tmp / "r"),
                        "--model.preset", "gpt2-nano", "--model.block_size", "32", "--train.max_steps", "2",
                        "--train.micro_batch_size", "2", "--train.eval_interval", "0", "--train.report", "false",
                        "--quiet"], check=True, capture_output=True)
        shutil.copytree(tmp / "r", tmp / "r_dcp")
        for f in (tmp / "r_dcp").glob("checkpoints/step_*/model.safetensors"):
            f.unlink()
        text = tmp / "t.txt"
        text.write_text(files[0].read_text()[:4000])
        load0 = os.getloadavg()[0]
        gen = ["-m", "gptforge.cli", "generate", "RUN", "--max-new-tokens", "1"]
        ev = ["-m", "gptforge.cli", "evaluate", "RUN", "--text", str(text)]

        def on(cmd, run):
            return [py, *(str(run) if a == "RUN" else a for a in cmd)]

        cmds = {"python -c 'import torch'": [py, "-c", "import torch"],
                "gptforge --help": [py, "-m", "gptforge.cli", "--help"],
                "gptforge generate RUN --max-new-tokens 1": on(gen, tmp / "r"),
                "gptforge evaluate RUN --text FILE": on(ev, tmp / "r")}
        if any((tmp / "r" / "checkpoints").glob("step_*/model.safetensors")):
            cmds["  the same, no model.safetensors: generate"] = on(gen, tmp / "r_dcp")
            cmds["  the same, no model.safetensors: evaluate"] = on(ev, tmp / "r_dcp")
        rows = rounds(cmds, repeats)
        imports = {"generate": import_times(on(gen, tmp / "r")[1:]),
                   "generate, DCP path": import_times(on(gen, tmp / "r_dcp")[1:])}
    print(f"CPU: {cpu}; median of {repeats} rounds (each runs every command once); load average "
          f"{load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    print(f"  {'command':<45} {'wall s':>7} {'CPU s':>7}   beyond import torch (paired in a round): wall, CPU")
    for name, (w, c, dw, dc) in rows.items():
        extra = "" if name.startswith("python") or "help" in name else f"   {dw:+.2f} s, {dc:+.2f} s"
        print(f"  {name:<45} {w:7.2f} {c:7.2f}{extra}")
    print("cumulative import time (-X importtime, one run), seconds:")
    for name, got in imports.items():
        print(f"  {name:<20} " + ", ".join(f"{m} {got[m]:.2f}" if m in got else f"{m} not imported" for m in HEAVY))


if __name__ == "__main__":
    main()
