"""Kill-and-resume soak: random SIGKILLs of `gptforge pretrain` and `gptforge prepare`.

Pretrain: a tiny model (gpt2-nano, block 32, dropout on, fp32, one thread) that checkpoints every
`--checkpoint-interval` steps. An uninterrupted run of the same config is the reference. Then
trials: each starts `gptforge pretrain --data D --out R ...`, and every launch is SIGKILLed by a
schedule drawn at random per launch, until the trial's kill budget is spent; after each kill
`gptforge pretrain --out R --resume` is started (a failed resume is followed by a plain rerun of
the first command; when both fail the state is a *dead end*). The last launch runs to the end.
The kill schedules:
- checkpoint: wait for the k-th new `checkpoints/.tmp_step_*` folder of this launch (k in 1..3),
  then kill after 0-30 ms (aims at the checkpoint writer);
- training: wait for this launch's first metrics row past its resume step, then kill after 0-2 s;
- startup: kill 0.5-8 s after launch (import, config, model build, or the first steps).
What a kill hit is read from the run folder right after it: a temp checkpoint folder created by
this launch (killed during the DCP write / fsync, before the rename), a step folder newer than
`latest` (after the rename, before the pointer), a `.latest.*.tmp` file (during the pointer
write); any of these counts as a kill during a checkpoint write. Otherwise the kill hit start-up
(no row past the resume step yet) or training; a kill that leaves logged steps but no complete
checkpoint (the first save cut short) is counted too ("--resume" then starts fresh). After each kill the checkpoint
that `find_checkpoint` chooses is verified. At the end the trial's metrics.jsonl rows (one per
step, 1..max_steps) are compared with the reference's: loss, val_loss and grad_norm must be
bit-identical; the max absolute difference is printed.

Prepare: a corpus of a few MB of standard-library sources (copied into the work folder), several
workers and small work shards, so kills land in different phases. The reference is an
uninterrupted prepare. Each trial kills 1-2 launches of the same command, in turn at a random
instant (0.3 s to the reference's wall time) or 0-0.2 s after the work folder shows a given phase
(count lines, curate, after curate, encode), reruns it to the end, and compares the output with the
reference: meta.json, tokenizer.json and every .bin by SHA-256; report.json with its timing
fields ("seconds", "*_per_second", "throughput", "machine") and "resumed" (true after a kill) removed; report.html is not compared
(it shows the timings). Before each kill the process tree under the command is read from /proc;
after the kill, any of those processes (same pid and start time, not a zombie) still running
after a 10 s grace is an orphan. The phase a kill hit is read from the work folder.

Prints the CPU, the load average, and a table: kills, kills during checkpoint write, resumes,
dead ends, max loss diff, prepare kills, orphan processes, identical outputs.

Usage: python bench/kill_soak.py [--kills 21] [--kills-per-trial 7] [--prepare-kills 10] [--seed 0] [--steps 80]
       [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from machine import cpu_description  # bench/machine.py

GPTFORGE = shutil.which("gptforge") or str(Path(sys.executable).with_name("gptforge"))


# ----------------------------------------------------------------------------------------- /proc


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, start time in clock ticks) of `pid` from /proc/PID/stat, or None when gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    rest = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) "
    return int(rest[1]), rest[0], int(rest[19])


def descendants(pid: int) -> dict[int, int]:
    """{pid: start time} of every process below `pid` (scans /proc once)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            s = _stat(int(d))
            if s is not None:
                children.setdefault(s[0], []).append(int(d))
                starts[int(d)] = s[2]
    out, todo = {}, [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out[c] = starts[c]
            todo.append(c)
    return out


def still_running(procs: dict[int, int]) -> list[int]:
    """The pids of `procs` that still run (same start time, not a zombie)."""
    alive = []
    for pid, start in procs.items():
        s = _stat(pid)
        if s is not None and s[2] == start and s[1] not in ("Z", "X"):
            alive.append(pid)
    return alive


def orphans_after_kill(tree: dict[int, int], grace: float = 10.0) -> list[int]:
    """Processes of `tree` still running `grace` seconds after their parent was killed."""
    deadline = time.time() + grace
    while time.time() < deadline:
        if not still_running(tree):
            return []
        time.sleep(0.1)
    left = still_running(tree)
    for pid in left:  # do not let them disturb the rest of the soak
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


# ----------------------------------------------------------------------------------------- helpers




def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def env() -> dict[str, str]:
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "1")
    e["PYTHONUNBUFFERED"] = "1"
    return e


def launch(args: list[str], log: Path) -> subprocess.Popen:
    f = open(log, "ab")
    p = subprocess.Popen([GPTFORGE, *args], stdout=f, stderr=subprocess.STDOUT, env=env())
    f.close()
    return p


def last_lines(log: Path, n: int = 3) -> str:
    try:
        return " | ".join(log.read_text(errors="replace").strip().splitlines()[-n:])
    except OSError:
        return ""


def kill_and_reap(p: subprocess.Popen) -> tuple[dict[int, int], bool]:
    """SIGKILL `p` (after reading its process tree); False when it had already exited."""
    tree = descendants(p.pid)
    if p.poll() is not None:
        return tree, False
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    return tree, p.returncode == -signal.SIGKILL


# ----------------------------------------------------------------------------------------- pretrain


def pretrain_args(data: Path, run: Path, a: argparse.Namespace) -> list[str]:
    return ["pretrain", "--data", str(data), "--out", str(run),
            "--model.preset", "gpt2-nano", "--model.block_size", "32", "--model.dropout", "0.1",
            "--train.max_steps", str(a.steps), "--train.micro_batch_size", "4",
            "--train.gradient_accumulation_steps", "2", "--train.lr", "3e-3", "--train.warmup_steps", "5",
            "--train.eval_interval", "10", "--train.eval_steps", "2",
            "--train.checkpoint_interval", str(a.checkpoint_interval), "--train.keep_checkpoints", "2",
            "--train.tensorboard", "false", "--train.report", "false", "--train.precision", "fp32",
            "--train.num_threads", "1", "--train.seed", "7"]


def tmp_inodes(ckroot: Path) -> set[tuple[str, int]]:
    out = set()
    try:
        for e in os.scandir(ckroot):
            if e.name.startswith(".tmp_step_") or (e.name.startswith(".latest.") and e.name.endswith(".tmp")):
                out.add((e.name, e.inode()))
    except FileNotFoundError:
        pass
    return out


def last_step(run: Path) -> int:
    """The step of the last complete metrics.jsonl row (0 when there is none)."""
    try:
        tail = (run / "metrics.jsonl").read_bytes()[-4096:]
    except FileNotFoundError:
        return 0
    for line in reversed(tail.split(b"\n")[:-1]):  # the part after the last newline may be cut
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return 0


def resume_step(run: Path) -> int:
    """The step a --resume of `run` starts from (0: no checkpoint yet)."""
    from gptforge.errors import DamagedFileError
    from gptforge.runtime import checkpoint as ck

    try:
        return int(ck.find_checkpoint(run).name.split("_")[1])
    except (FileNotFoundError, DamagedFileError):  # a damaged run is reported after the kill
        return 0


def wait_and_kill(p: subprocess.Popen, run: Path, rng: random.Random) -> dict:
    """Run one launch under a random kill schedule; kill it unless it ends first."""
    ckroot = run / "checkpoints"
    before = tmp_inodes(ckroot)
    r = rng.random()
    mode = "checkpoint" if r < 0.55 else ("training" if r < 0.88 else "startup")
    t0 = time.time()
    kill_at = None
    if mode == "startup":
        kill_at = t0 + rng.uniform(0.5, 8.0)
    target, seen = rng.randint(1, 3), set()
    start = resume_step(run)
    while p.poll() is None:
        now = time.time()
        if kill_at is not None:
            if now >= kill_at:
                break
        elif mode == "checkpoint":
            new = {n for n in tmp_inodes(ckroot) - before if n[0].startswith(".tmp_step_")}
            seen |= new
            if len(seen) >= target:
                kill_at = now + rng.uniform(0.0, 0.03)
                continue
        elif last_step(run) > start:
            kill_at = now + rng.uniform(0.0, 2.0)
        time.sleep(0.002 if mode == "checkpoint" else 0.02)
    tree, killed = kill_and_reap(p)
    info = {"mode": mode, "killed": killed, "rc": p.returncode, "orphans": 0, "where": None}
    if not killed:
        return info
    info["orphans"] = len(orphans_after_kill(tree))
    # What the kill hit, from what it left.
    left = tmp_inodes(ckroot) - before
    from gptforge.errors import DamagedFileError
    from gptforge.runtime import checkpoint as ck

    latest = ck.read_pointer(ckroot, "latest") if ckroot.is_dir() else None
    steps = sorted(d.name for d in ckroot.glob("step_*") if d.is_dir()) if ckroot.is_dir() else []
    if any(n.startswith(".tmp_step_") for n, _ in left):
        info["where"] = "checkpoint: DCP write / fsync (temp folder left)"
    elif steps and (latest is None or steps[-1] > latest.name) and any(ck.is_complete(ckroot / s) for s in steps):
        info["where"] = "checkpoint: after the rename, before `latest`"
    elif any(n.startswith(".latest.") for n, _ in left):
        info["where"] = "checkpoint: writing `latest`"
    elif last_step(run) <= start:
        info["where"] = "start-up (before this launch's first step)"
    elif not steps:
        info["where"] = "training, before the first checkpoint"
    else:
        info["where"] = "training, between checkpoints"
    info["resume_from"] = resume_step(run)
    try:
        chosen = ck.find_checkpoint(run)
        info["checkpoint_ok"] = ck.verify_checkpoint(chosen) is None
    except (FileNotFoundError, DamagedFileError) as e:
        info["checkpoint_ok"] = not steps  # nothing saved yet is fine
        info["checkpoint_error"] = str(e)[:200]
    return info


@dataclass
class PretrainStats:
    kills: int = 0
    during_write: int = 0
    resumes: int = 0
    fallback_reruns: int = 0
    dead_ends: int = 0
    orphans: int = 0
    damaged: int = 0
    no_checkpoint: int = 0
    max_diff: float = 0.0
    identical_trials: int = 0
    trials: int = 0
    where: dict[str, int] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)


def compare_metrics(ref: list[dict], got: list[dict], steps: int) -> tuple[float, bool, str]:
    """(max |diff| over loss/val_loss/grad_norm, bit-identical?, problem or '')."""
    if [r["step"] for r in got] != list(range(1, steps + 1)):
        return math.inf, False, f"steps are {[r['step'] for r in got][:5]}... ({len(got)} rows), not 1..{steps}"
    worst, same = 0.0, True
    for a, b in zip(ref, got, strict=True):
        for key in ("loss", "val_loss", "grad_norm", "lr"):
            x, y = a.get(key), b.get(key)
            if x != y:
                same = False
                worst = max(worst, math.inf if x is None or y is None else abs(x - y))
    return worst, same, ""


def soak_pretrain(a: argparse.Namespace, root: Path, data: Path, rng: random.Random) -> PretrainStats:
    from gptforge.train.loggers import read_metrics

    st = PretrainStats()
    ref = root / "pretrain_ref"
    t0 = time.time()
    p = launch(pretrain_args(data, ref, a), root / "pretrain_ref.log")
    if p.wait() != 0:
        raise SystemExit(f"the reference pretrain failed: {last_lines(root / 'pretrain_ref.log')}")
    ref_rows = read_metrics(ref)
    print(f"reference pretrain: {a.steps} steps in {time.time() - t0:.1f} s wall (start-up included)", flush=True)
    per_trial = max(1, a.kills_per_trial)
    trial = 0
    while st.kills < a.kills:
        trial += 1
        budget = min(per_trial, a.kills - st.kills)
        run, log = root / f"pretrain_{trial:02d}", root / f"pretrain_{trial:02d}.log"
        first = pretrain_args(data, run, a)
        cmd, dead = first, False
        kills_here = 0
        while True:
            p = launch(cmd, log)
            if kills_here < budget:
                info = wait_and_kill(p, run, rng)
            else:
                p.wait()
                info = {"killed": False, "rc": p.returncode}
            if info["killed"]:
                kills_here += 1
                st.kills += 1
                st.orphans += info["orphans"]
                st.modes[info["mode"]] = st.modes.get(info["mode"], 0) + 1
                st.where[info["where"]] = st.where.get(info["where"], 0) + 1
                st.during_write += info["where"].startswith("checkpoint")
                st.damaged += not info["checkpoint_ok"]
                st.no_checkpoint += info["resume_from"] == 0 and last_step(run) > 0
                print(f"  trial {trial} kill {kills_here}: {info['mode']:10s} -> {info['where']}; "
                      f"resume from step {info['resume_from']} (logged {last_step(run)})"
                      f"{'' if info['checkpoint_ok'] else ' DAMAGED: ' + info.get('checkpoint_error', '')}",
                      flush=True)
                cmd = ["pretrain", "--out", str(run), "--resume"]
                st.resumes += 1
                continue
            if info["rc"] == 0:
                break
            # A launch failed by itself: the state after the last kill is not resumable.
            print(f"  trial {trial}: `{' '.join(cmd[:4])}...` exited {info['rc']}: {last_lines(log)}", flush=True)
            if cmd is first:
                dead = True
                break
            st.fallback_reruns += 1
            cmd = first
        st.trials += 1
        if dead:
            st.dead_ends += 1
            print(f"  trial {trial}: DEAD END (neither --resume nor a rerun continues {run})", flush=True)
            continue
        diff, same, problem = compare_metrics(ref_rows, read_metrics(run), a.steps)
        st.max_diff = max(st.max_diff, diff)
        st.identical_trials += same
        print(f"  trial {trial}: {kills_here} kills, final metrics {'bit-identical' if same else 'DIFFER'}"
              f"{' (max diff %.3g)' % diff if not same else ''} {problem}", flush=True)
    return st


# ----------------------------------------------------------------------------------------- prepare


def make_corpus(dest: Path, mb: float) -> int:
    from gptforge.data.stdlib_corpus import stdlib_files

    dest.mkdir(parents=True)
    total = 0
    for i, f in enumerate(stdlib_files()):
        shutil.copyfile(f, dest / f"{i:05d}_{f.name}.txt")
        total += f.stat().st_size
        if total >= mb * 1e6:
            break
    return total


def prepare_args(corpus: Path, out: Path, a: argparse.Namespace) -> list[str]:
    return ["prepare", str(corpus), "--out", str(out), "--vocab-size", "512", "--workers", str(a.workers),
            "--shard-bytes", "250000", "--recipe", "web", "--val-fraction", "0.05", "--no-progress"]


_TIMING_KEYS = {"seconds", "throughput", "machine", "resumed"}  # resumed: True after a kill, rightly


def _strip_timing(x):
    if isinstance(x, dict):
        return {k: _strip_timing(v) for k, v in x.items()
                if k not in _TIMING_KEYS and not k.endswith("_per_second") and not k.endswith("_seconds")}
    if isinstance(x, list):
        return [_strip_timing(v) for v in x]
    return x


def output_digest(out: Path) -> dict[str, str]:
    d = {p.name: sha256(p) for p in sorted(out.iterdir()) if p.name not in ("report.html", "report.json")}
    rep = out / "report.json"
    if rep.exists():
        d["report.json (timings removed)"] = hashlib.sha256(
            json.dumps(_strip_timing(json.loads(rep.read_text())), sort_keys=True).encode()).hexdigest()
    return d


def prepare_phase(out: Path, n_shards: int) -> str:
    work = out.parent / f".{out.name}.work"
    if out.is_dir() and (out / "meta.json").exists():
        return "output written" + (" (work folder not yet removed)" if work.exists() else "")
    if not work.is_dir():
        return "start-up (no work folder yet)"
    enc = [d for d in work.glob("encode-*") if d.is_dir()]
    if enc:
        return "encode"
    if (work / "tokenizer.json").exists():
        return "tokenizer trained, before encode"
    if (work / "dedup").is_dir() and any((work / "dedup").iterdir()):
        return "dedup"
    curated = len(list((work / "curate").glob("*.json"))) if (work / "curate").is_dir() else 0
    if curated:
        return "curate" if curated < n_shards else "after curate (dedup / split / tokenizer)"
    lines = len(list((work / "lines").glob("*.json"))) if (work / "lines").is_dir() else 0
    return "count lines" if lines < n_shards else "boilerplate / curate start"


# Kill targets, in turn: an instant drawn from the reference's wall time, or 0-0.2 s after the
# work folder first shows the phase (`prepare_phase`'s wording).
_PREPARE_TARGETS = ("random", "count lines", "curate", "after curate", "encode")


@dataclass
class PrepareStats:
    kills: int = 0
    orphans: int = 0
    reruns: int = 0
    dead_ends: int = 0
    identical: int = 0
    trials: int = 0
    missed: int = 0
    phases: dict[str, int] = field(default_factory=dict)


def soak_prepare(a: argparse.Namespace, root: Path, rng: random.Random) -> PrepareStats:
    st = PrepareStats()
    corpus = root / "corpus"
    size = make_corpus(corpus, a.corpus_mb)
    n_shards = math.ceil(size / 250000)
    ref = root / "prepare_ref"
    t0 = time.time()
    p = launch(prepare_args(corpus, ref, a), root / "prepare_ref.log")
    if p.wait() != 0:
        raise SystemExit(f"the reference prepare failed: {last_lines(root / 'prepare_ref.log')}")
    wall = time.time() - t0
    want = output_digest(ref)
    print(f"reference prepare: {size / 1e6:.1f} MB, {a.workers} workers, about {n_shards} work shards, "
          f"{wall:.1f} s wall", flush=True)
    trial = 0
    while st.kills < a.prepare_kills:
        trial += 1
        out, log = root / f"prepare_{trial:02d}", root / f"prepare_{trial:02d}.log"
        budget = min(rng.choice((1, 2)), a.prepare_kills - st.kills)
        for k in range(budget):
            target = _PREPARE_TARGETS[(st.kills + st.missed) % len(_PREPARE_TARGETS)]
            p = launch(prepare_args(corpus, out, a), log)
            deadline = time.time() + rng.uniform(0.3, wall) if target == "random" else math.inf
            tree: dict[int, int] = {}
            while p.poll() is None and time.time() < deadline:
                tree.update(descendants(p.pid))  # workers come and go: keep all seen
                if deadline == math.inf and prepare_phase(out, n_shards).startswith(target):
                    deadline = time.time() + rng.uniform(0.0, 0.2)
                time.sleep(0.02)
            last, killed = kill_and_reap(p)
            tree.update(last)
            if not killed:
                st.missed += 1
                print(f"  trial {trial}: launch ended (rc {p.returncode}) before its kill at {target}", flush=True)
                continue
            st.kills += 1
            st.reruns += 1
            left = orphans_after_kill(tree)
            st.orphans += len(left)
            phase = prepare_phase(out, n_shards)
            st.phases[phase] = st.phases.get(phase, 0) + 1
            print(f"  trial {trial} kill {k + 1}: at {phase}; {len(tree)} child processes, "
                  f"{len(left)} still running 10 s later", flush=True)
        p = launch(prepare_args(corpus, out, a), log)
        st.trials += 1
        if p.wait() != 0:
            st.dead_ends += 1
            print(f"  trial {trial}: DEAD END, the rerun exited {p.returncode}: {last_lines(log)}", flush=True)
            continue
        got = output_digest(out)
        same = got == want
        st.identical += same
        bad = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        print(f"  trial {trial}: output {'identical' if same else 'DIFFERS in ' + ', '.join(bad)}", flush=True)
    return st


# ----------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=21, help="SIGKILLs of pretrain (at least 20 for issue 15)")
    ap.add_argument("--kills-per-trial", type=int, default=7, help="kills before a trial's run may finish")
    ap.add_argument("--prepare-kills", type=int, default=10, help="SIGKILLs of prepare")
    ap.add_argument("--steps", type=int, default=80, help="pretrain max_steps")
    ap.add_argument("--checkpoint-interval", type=int, default=3)
    ap.add_argument("--workers", type=int, default=3, help="prepare worker processes")
    ap.add_argument("--corpus-mb", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=None, help="where the runs go (default: a temp folder, removed)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    root = Path(a.workdir or tempfile.mkdtemp(prefix="kill_soak_"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"machine: {cpu_description()}; load average at start {os.getloadavg()[0]:.1f}", flush=True)
    print(f"work folder: {root}", flush=True)
    t0 = time.time()
    try:
        ps = soak_prepare(a, root, rng)
        data = root / "prepare_ref"
        ts = soak_pretrain(a, root, data, rng)
    finally:
        if not a.keep and a.workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"\nwall {time.time() - t0:.0f} s, load average at end {os.getloadavg()[0]:.1f}")
    print("\npretrain kills by schedule: " + ", ".join(f"{k} {v}" for k, v in sorted(ts.modes.items())))
    print("pretrain kills by what they hit: " + "; ".join(f"{k}: {v}" for k, v in sorted(ts.where.items())))
    print("prepare kills by phase: " + "; ".join(f"{k}: {v}" for k, v in sorted(ps.phases.items())))
    rows = [
        ("pretrain kills", ts.kills),
        ("kills during checkpoint write", ts.during_write),
        ("resumes (--resume launches)", ts.resumes),
        ("kills leaving logged steps but no checkpoint", ts.no_checkpoint),
        ("fallback plain reruns", ts.fallback_reruns),
        ("damaged chosen checkpoints", ts.damaged),
        ("dead ends (pretrain + prepare)", ts.dead_ends + ps.dead_ends),
        ("max loss diff vs uninterrupted", "0 (bit-identical)" if ts.max_diff == 0 else f"{ts.max_diff:.3g}"),
        ("pretrain trials identical", f"{ts.identical_trials}/{ts.trials}"),
        ("prepare kills", ps.kills),
        ("orphan processes (both commands)", ps.orphans + ts.orphans),
        ("identical outputs (prepare)", f"{ps.identical}/{ps.trials}"),
    ]
    print("\n| figure | value |\n|---|---:|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    ok = (ts.dead_ends + ps.dead_ends == 0 and ts.max_diff == 0 and ps.orphans + ts.orphans == 0
          and ps.identical == ps.trials and ts.damaged == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
