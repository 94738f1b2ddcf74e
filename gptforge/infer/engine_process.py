"""A continuous-batching `Engine` in its own process, driven from the parent through a pipe.

In one process the engine's thread and an HTTP server's event loop share one interpreter lock:
while the loop frames and writes a step's tokens, the engine waits for the lock between its torch
calls. `EngineProcess` runs the `Engine` in a child process (started with "spawn", so no threads or
locks of the parent are inherited) and offers the same calls the server makes on an `Engine`:
`submit`, `cancel`, `pause` / `resume`, `start` / `stop`, `step_hooks`, `stats`, `num_waiting`,
`num_running`, `num_free_slots`, `max_batch_size` and `max_model_len`.

The child gets the model's tensors through torch.multiprocessing (shared memory, not a copy) and
builds the detokenizer from the tokenizer file itself, so detokenization, stop strings and
log-probabilities run beside the model, as in process. Messages:

- parent -> child: ("submit", id, prompt, params), ("cancel", id), ("pause",), ("resume",), ("stop",)
- child -> parent: ("ready",) once the engine runs; ("events", [(id, Event), ...], EngineStats,
  child CPU seconds) once per step that produced events; ("alive", EngineStats, CPU seconds) after
  HEARTBEAT_S without another message; ("stopped", EngineStats, CPU seconds) last.

The child ignores SIGINT and SIGTERM (a Ctrl-C or a `kill` of the process group reaches the parent,
which drains and then stops the child) and stops by itself when the parent's end of the pipe
closes. When the child dies, every unfinished request gets an "error" event and later submissions
raise RuntimeError, until the child is restarted: with `max_restarts`, the reader spawns a new child
(from the same shared weights) after a death, at most `max_restarts` times in RESTART_WINDOW_S.
"""

from __future__ import annotations

import itertools
import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from gptforge.infer.engine import Engine, EngineStats, Event, Request, SamplingParams, check_request, engine_context
from gptforge.model.gpt import GPT

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0
"""Seconds `start` waits for the child to import torch, map the weights and report ready."""
HEARTBEAT_S = 1.0
"""The child's reader thread sends ("alive", ...) after this many seconds without a message."""
STALL_S = 10.0
"""A child that has sent nothing for this long (stopped, or hung outside its engine thread) is not
`alive`: /health answers 503 and submissions are refused. A long engine step does not count: the
heartbeat comes from another thread of the child."""
RESTART_WINDOW_S = 600.0
"""`max_restarts` counts the restarts within this many seconds: a child that keeps dying (a broken
model, memory the machine lacks) is left down after that many, for a supervisor to see."""


class RemoteRequest:
    """The parent's view of one request in the child engine: `started` after its first event,
    `finished` after the event with a finish_reason (or after `EngineProcess.cancel`)."""

    def __init__(self, rid: int, on_event: Callable[[Event], None]):
        self.rid, self.on_event = rid, on_event
        self.started = False
        self.finished = False


class EngineProcess:
    """An `Engine` (gptforge.infer.engine) over `model` in a child process.

    Args:
        model: a GPT in eval mode (CPU or CUDA); its tensors are shared with the child, not copied.
        tokenizer_file: the tokenizer.json the child decodes with (gptforge.data.tokenizer.Tokenizer).
        max_batch_size, max_model_len: as for `Engine`.
        threads: torch intra-op threads of the child (default: this process's torch.get_num_threads()).
        max_restarts: how many times a child that died is replaced by a new one within
            RESTART_WINDOW_S seconds (0: never; the engine then stays down after a death).
        engine_options: further keyword arguments of the child's `Engine` (prefix caching,
            speculation, the compiled decode step).

    `start()` spawns the child and waits until it is ready; `submit` may be called from any thread.
    `on_event` callbacks and `step_hooks` run on this process's reader thread, once per child step.

    Raises:
        ValueError: max_model_len above the model's block_size, or max_batch_size < 1.
    """

    def __init__(self, model: GPT, tokenizer_file: str | Path, max_batch_size: int = 8,
                 max_model_len: int | None = None, threads: int | None = None, max_restarts: int = 0,
                 engine_options: dict | None = None):
        max_model_len = engine_context(model, max_batch_size, max_model_len)
        self.model = model.eval()
        self.tokenizer_file = str(tokenizer_file)
        self.max_batch_size, self.max_model_len = max_batch_size, max_model_len
        self.threads = threads or torch.get_num_threads()
        self.engine_options = dict(engine_options or {})
        self.stats = EngineStats()
        self.child_cpu_seconds = 0.0
        """CPU seconds (user + system) of the child process, as of its last message."""
        self.step_hooks: list[Callable[[], None]] = []
        self._requests: dict[int, RemoteRequest] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()  # guards _requests and sends on the pipe
        self._conn: Any = None  # multiprocessing Connection while started
        self._proc: Any = None  # the spawned Process while started
        self._reader: threading.Thread | None = None
        self._ready = threading.Event()
        self._dead: str | None = None
        self._last_seen = time.monotonic()  # of the child's last message
        self.max_restarts = max_restarts
        self.restarts = 0
        """Children started after a death (the first start not counted)."""
        self._restart_times: list[float] = []
        self._stopping = False

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the child and wait until its engine runs (seconds: it imports torch).

        Raises:
            RuntimeError: the child exited or did not report ready within START_TIMEOUT_S.
        """
        if self._proc is not None:
            return
        self._stopping = False
        self._spawn()

    def _spawn(self) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child_end = ctx.Pipe()
        self._proc = ctx.Process(target=_child_main, name="gptforge-engine", daemon=True,
                                 args=(child_end, self.model, self.tokenizer_file, self.max_batch_size,
                                       self.max_model_len, self.threads, self.engine_options))
        try:
            self._proc.start()
        except Exception as e:  # noqa: BLE001 - pickling the model: hooks, lambdas, compiled wrappers
            self._proc = None
            raise RuntimeError(f"the model cannot be sent to an engine process ({type(e).__name__}: {e}); "
                               "serve it in process instead") from e
        finally:
            child_end.close()
        self._dead = None
        self._last_seen = time.monotonic()
        self._reader = threading.Thread(target=self._read, name="gptforge-engine-reader", daemon=True)
        self._reader.start()
        if not self._ready.wait(START_TIMEOUT_S) or self._dead:
            why = self._dead or f"no answer in {START_TIMEOUT_S:.0f} s"
            self.stop(timeout=5)
            raise RuntimeError(f"the engine process did not start: {why}")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the child (its unfinished sequences get "cancelled" events) and wait for it, up to
        `timeout` seconds for each of the reader thread and the child; a child that is already
        dead or silent (`down_reason`) will not answer the stop, and is killed at once."""
        self._stopping = True  # a death from here on is not followed by a restart
        if self._proc is None:
            return
        if self._ready.is_set() and self.down_reason() is not None:
            timeout = 0.0
        try:
            self._send(("stop",))
        except (OSError, RuntimeError):
            pass
        if self._reader is not None:
            self._reader.join(timeout)
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self._conn.close()
        self._proc, self._reader = None, None
        self._ready.clear()
        self._fail_all(Event(finish_reason="cancelled"))

    @property
    def alive(self) -> bool:
        """Whether the child runs and has answered within STALL_S seconds."""
        return self.down_reason() is None

    def down_reason(self) -> str | None:
        """Why the engine process cannot take work (not started, exited, silent), or None."""
        if self._proc is None:
            return "the engine process is not running"
        if self._dead is not None:
            return self._dead
        if not self._ready.is_set():
            return "the engine process is starting"
        if not self._proc.is_alive():
            return f"the engine process exited with code {self._proc.exitcode}"
        silent = time.monotonic() - self._last_seen
        if silent > STALL_S:
            return f"the engine process has not answered for {silent:.0f} s"
        return None

    # ---- requests -----------------------------------------------------------------------------

    def submit(self, prompt: Sequence[int], params: SamplingParams, on_event: Callable[[Event], None]) -> RemoteRequest:
        """Queue a request in the child; `on_event` receives its Events until one has a finish_reason.

        Raises:
            ValueError: an empty prompt, or prompt + max_tokens longer than max_model_len.
            RuntimeError: the engine process is not running (never started, stopped, or died).
        """
        check_request(prompt, params, self.max_model_len)
        req = RemoteRequest(next(self._ids), on_event)
        with self._lock:
            why = self.down_reason()
            if why is not None:
                raise RuntimeError(why)
            self._requests[req.rid] = req
            self._conn.send(("submit", req.rid, list(prompt), params))
        return req

    def cancel(self, req: RemoteRequest) -> None:
        """Stop a request; its slot frees at the child's next step (no event is sent after this)."""
        with self._lock:
            req.finished = True
            self._requests.pop(req.rid, None)
            if self.alive:
                self._conn.send(("cancel", req.rid))

    def pause(self) -> None:
        """Hold the child's engine before its next step until `resume()` (see `Engine.pause`)."""
        self._send(("pause",))

    def resume(self) -> None:
        """Let the child's engine step again after `pause()`."""
        self._send(("resume",))

    @property
    def num_waiting(self) -> int:
        """Requests submitted that have had no event yet (waiting for a slot, or in their prefill)."""
        return sum(not r.started for r in list(self._requests.values()))

    @property
    def num_running(self) -> int:
        """Requests that have had events and not finished."""
        return sum(r.started for r in list(self._requests.values()))

    @property
    def num_free_slots(self) -> int:
        """Cache slots that no started request holds."""
        return max(0, self.max_batch_size - self.num_running)

    # ---- the reader thread --------------------------------------------------------------------

    def _send(self, msg) -> None:
        with self._lock:
            if self._conn is None or self._conn.closed:
                raise RuntimeError("the engine process is not running")
            self._conn.send(msg)

    def _read(self) -> None:
        conn, proc = self._conn, self._proc
        ready = False  # a child that dies before it is ready is not restarted (start() reports it)
        try:
            while True:
                msg = conn.recv()
                self._last_seen = time.monotonic()
                if msg[0] == "events":
                    self._deliver(msg[1])
                    self.stats, self.child_cpu_seconds = msg[2], msg[3]
                    self._run_hooks()
                elif msg[0] == "ready":
                    ready = True
                    self._ready.set()
                elif msg[0] == "alive":
                    self.stats, self.child_cpu_seconds = msg[1], msg[2]
                elif msg[0] == "stopped":
                    self.stats, self.child_cpu_seconds = msg[1], msg[2]
                    return
        except (EOFError, OSError):
            proc.join(1)
            self._dead = f"the engine process exited with code {proc.exitcode}"
            log.error("%s", self._dead)
            self._ready.set()
            self._fail_all(Event(finish_reason="error", error=self._dead))
            if ready:
                self._restart(proc)

    def _restart(self, dead_proc) -> None:
        """Replace the child `dead_proc` by a new one (on the reader thread that saw it die), unless
        stopping or out of restarts; /health stays 503 until the new child is ready."""
        now = time.monotonic()
        self._restart_times = [t for t in self._restart_times if now - t < RESTART_WINDOW_S]
        if self._stopping or self._proc is not dead_proc:
            return
        if len(self._restart_times) >= self.max_restarts:
            why = (f"it died {len(self._restart_times) + 1} times in {RESTART_WINDOW_S:.0f} s and is not restarted "
                   "again" if self.max_restarts else "restarts are off")
            self._dead = f"{self._dead}; {why}: restart the server"  # what /health and a 503 say
            log.error("%s", self._dead)
            return
        self._restart_times.append(now)
        why = self._dead
        with self._lock:
            self._dead = f"{why}; a new one is starting"
            self._conn.close()
        self._ready.clear()
        log.warning("%s: starting a new engine process", why)
        try:
            self._spawn()
        except RuntimeError as e:
            log.error("%s; the new engine process did not start: %s", why, e)
            return
        self.restarts += 1
        if self._stopping:  # stop() ran while the new child started
            self.stop(timeout=5)

    def _deliver(self, events: list[tuple[int, Event]]) -> None:
        for rid, ev in events:
            req = self._requests.get(rid)
            if req is None:  # cancelled (or failed) meanwhile
                continue
            req.started = True
            if ev.finish_reason:
                req.finished = True
                with self._lock:
                    self._requests.pop(rid, None)
            req.on_event(ev)

    def _fail_all(self, ev: Event) -> None:
        with self._lock:
            left = [r for r in self._requests.values() if not r.finished]
            self._requests.clear()
        for r in left:
            r.finished = True
            r.on_event(Event(finish_reason=ev.finish_reason, error=ev.error))
        self._run_hooks()

    def _run_hooks(self) -> None:
        for hook in self.step_hooks:
            hook()


def _child_main(conn, model: GPT, tokenizer_file: str, max_batch_size: int, max_model_len: int,
                threads: int, engine_options: dict) -> None:
    """The child: an Engine in a thread, this thread reading the parent's messages."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _name_process(b"gptforge-engine")
    torch.set_num_threads(threads)
    from gptforge.data.tokenizer import Tokenizer
    from gptforge.infer.grammar import GrammarVocab
    tok = Tokenizer.from_file(tokenizer_file)
    engine = Engine(model, tok.decode, max_batch_size, max_model_len, **engine_options)
    engine.grammar_vocab = GrammarVocab(tok.to_str(), model.config.vocab_size, tok.eos_id)
    send_lock, seqs_lock = threading.Lock(), threading.Lock()
    pending: list[tuple[int, Event]] = []
    seqs: dict[int, Request] = {}  # unfinished requests by the parent's id (for cancel)

    def flush() -> None:  # a step hook: one message per step
        if not pending:
            return
        batch = pending[:]
        pending.clear()
        _send_quietly(("events", batch, engine.stats, time.process_time()))

    def _send_quietly(msg) -> None:
        try:
            with send_lock:
                conn.send(msg)
        except OSError:  # the parent has gone: the reader sees the pipe's end and stops the engine
            pass

    def sink(rid: int):
        def on_event(ev: Event) -> None:
            pending.append((rid, ev))
            if ev.finish_reason:
                with seqs_lock:
                    seqs.pop(rid, None)
        return on_event

    engine.step_hooks.append(flush)
    engine.start()
    with send_lock:
        conn.send(("ready",))
    try:
        while True:
            if not conn.poll(HEARTBEAT_S):
                _send_quietly(("alive", engine.stats, time.process_time()))
                continue
            msg = conn.recv()
            kind = msg[0]
            if kind == "submit":
                with seqs_lock:  # held until stored: its finishing event (engine thread) pops it after
                    try:
                        seqs[msg[1]] = engine.submit(msg[2], msg[3], sink(msg[1]))
                    except ValueError as e:  # a grammar the parent let through: this request alone fails
                        _send_quietly(("events", [(msg[1], Event(finish_reason="error", error=str(e)))],
                                       engine.stats, time.process_time()))
            elif kind == "cancel":
                with seqs_lock:
                    seq = seqs.pop(msg[1], None)
                if seq is not None:
                    engine.cancel(seq)
            elif kind == "pause":
                engine.pause()
            elif kind == "resume":
                engine.resume()
            elif kind == "stop":
                break
    except (EOFError, OSError):  # the parent has gone
        pass
    engine.stop()
    flush()
    _send_quietly(("stopped", engine.stats, time.process_time()))


def _name_process(name: bytes) -> None:
    """Set the kernel's name of this process (what `pgrep NAME` and `ps -o comm` show; Linux only,
    at most 15 bytes)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):  # not Linux / no prctl: the name stays python
        pass
