"""Continuous batching: concurrent requests decoded together, joining and leaving between steps.

The engine owns one key/value cache with `max_batch_size` slots of `max_model_len` positions per
layer (`SlotKVCache`). Each step it (1) drops cancelled and finished sequences, freeing their
slots; (2) admits waiting requests in arrival order into free slots and prefills each (one
forward pass over its prompt, written into its slot); (3) runs one batched forward pass that
feeds every other running sequence its newest token at its own position, with a mask that lets
row b see only the filled positions of its slot. A request therefore starts as soon as a slot
frees, never after a whole other request has finished, and its greedy output is the same alone
or beside others (up to float rounding of batched matrix products). This is the iteration-level
scheduling of Orca (Yu et al., OSDI 2022) with a fixed slot per sequence instead of vLLM's pages.
Options: a prompt whose leading tokens some slot still holds starts its prefill after them
(`gptforge.infer.prefix_cache`); n-gram drafts verified in the decode pass give a row several
tokens per step (`gptforge.infer.speculative`); rows may carry LoRA adapters (`gptforge.infer.multi_lora`);
one-token passes may run as compiled static-shape steps (`gptforge.infer.engine_compile`).

Sampling per sequence: temperature, top-k, top-p, its own seeded generator, presence and
frequency penalties (OpenAI's definition: logit[j] -= presence * [c_j > 0] + frequency * c_j,
c_j = times token j was generated so far), stop token ids and stop strings, log-probabilities of
sampled and prompt tokens.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gptforge.infer.engine_compile import CompiledDecode
from gptforge.infer.generate import MIN_TEMPERATURE, filter_logits
from gptforge.infer.grammar import Constraint, GrammarVocab
from gptforge.infer.prefix_cache import PrefixCache, prefill_groups
from gptforge.infer.slots import SlotBatch, SlotKVCache
from gptforge.infer.speculative import make_speculator
from gptforge.infer.stream import StopStringFilter, StreamDetokenizer
from gptforge.model.gpt import GPT

log = logging.getLogger(__name__)


@dataclass
class SamplingParams:
    """How one sequence is sampled and when it ends.

    max_tokens: tokens to generate (0: only score the prompt, with prompt_logprobs).
    temperature: 0 is greedy. top_k: 0 = off. top_p: 1.0 = off. seed: None = nondeterministic.
    stop: strings that end the text (not included in it). stop_token_ids: ids that end it (the
    end-of-text token; its text is not included). logprobs: None, or how many top alternatives
    to report per generated token (0: only the sampled token's). prompt_logprobs: likewise for
    each prompt token after the first. presence_penalty / frequency_penalty: see the module doc.
    adapter: a LoRA adapter (`gptforge.infer.multi_lora.Adapter`) for this sequence's rows; None: the base.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    adapter: Any = None
    grammar: str | None = None
    """An llguidance grammar the output must follow (gptforge.infer.grammar.compile_*), or None."""


@dataclass
class TokenLogprob:
    """log p(token_id | context) in nats, and the `top` (id, logprob) alternatives, best first."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Event:
    """What one engine step produced for one sequence.

    token_id: the generated id (None for a prompt-only event). text: newly completed text (may
    be "" while a character or a possible stop string is held back). logprob: for the token when
    asked. prompt_logprobs: on the first event only, when asked (None for the first prompt token).
    finish_reason: None while running, then "stop" (stop string / stop token), "length",
    "cancelled" or "error" (then `error` holds the message).
    """

    token_id: int | None = None
    text: str = ""
    logprob: TokenLogprob | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    finish_reason: str | None = None
    error: str | None = None
    cached_tokens: int | None = None
    """On the first event: the leading prompt tokens whose keys and values were reused (`prefix_cache`)."""


@dataclass
class EngineStats:
    """Where an engine's steps spent their time, cumulative since it was built (benchmarks and
    profiling read it). Seconds are wall seconds (time.perf_counter); cpu_seconds is the CPU time of
    the thread that ran the steps (time.thread_time), so wall minus CPU is time waiting for a core or
    the GIL.

    steps: steps that did work. prefill_passes / prefill_sequences: forward passes over admitted
    prompts and the sequences they held. decode_passes / decode_rows: one-token forward passes and
    the sequences they held. emit_seconds: time in the `on_event` callbacks. prefix_query_tokens /
    prefix_hit_tokens: prompt tokens admitted, and those of them whose prefill a reused prefix
    skipped (`gptforge.infer.prefix_cache`; hit rate = hit / query). spec_draft_tokens /
    spec_accepted_tokens: n-gram draft tokens verified, and those accepted (`gptforge.infer.speculative`).
    """

    steps: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    prefill_passes: int = 0
    prefill_sequences: int = 0
    prefill_seconds: float = 0.0
    decode_passes: int = 0
    decode_rows: int = 0
    decode_seconds: float = 0.0
    emit_seconds: float = 0.0
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0


class Request:
    """The engine's state of one request (create through `Engine.submit`)."""

    def __init__(self, prompt: list[int], params: SamplingParams, on_event: Callable[[Event], None],
                 decode: Callable[[list[int]], str], device):
        self.prompt = list(prompt)
        self.params = params
        self.on_event = on_event
        self.generated: list[int] = []
        self.slot: int | None = None
        self.cancelled = False
        self.finished = False
        self.detok = StreamDetokenizer(decode)
        self.stops = StopStringFilter(params.stop)
        self.generator = None
        if params.seed is not None:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(params.seed)
        self.counts: torch.Tensor | None = None
        self.constraint: Constraint | None = None
        self.submitted = time.monotonic()
        self.cached = 0  # leading prompt positions its slot held before the prefill (prefix reuse)
        self.prefilled = False

    @property
    def length(self) -> int:
        """Positions this sequence fills in its slot (prompt + generated, the newest not yet fed)."""
        return len(self.prompt) + len(self.generated)


def _logprob_entry(logp_row: torch.Tensor, token_id: int, n: int) -> TokenLogprob:
    top = []
    if n > 0:
        vals, ids = torch.topk(logp_row, min(n, logp_row.numel()))
        top = list(zip(ids.tolist(), vals.tolist(), strict=True))
    return TokenLogprob(token_id, float(logp_row[token_id]), top)


def engine_context(model: GPT, max_batch_size: int, max_model_len: int | None) -> int:
    """The positions per sequence of an engine over `model` (max_model_len, default its block_size).

    Raises:
        ValueError: max_model_len above the model's block_size, or max_batch_size < 1.
    """
    block = model.config.block_size
    max_model_len = max_model_len or block
    if max_model_len > block:
        raise ValueError(f"max_model_len {max_model_len} exceeds the model's block_size {block}")
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    return max_model_len


def check_request(prompt: Sequence[int], params: SamplingParams, max_model_len: int) -> None:
    """Refuse a request no engine of context `max_model_len` (positions) can run.

    Raises:
        ValueError: an empty prompt, or prompt + max_tokens longer than max_model_len (naming both).
    """
    if not prompt:
        raise ValueError("the prompt is empty: give at least one token")
    if len(prompt) + params.max_tokens > max_model_len:
        raise ValueError(f"the prompt has {len(prompt)} tokens and max_tokens is {params.max_tokens}: "
                         f"together more than the model's context of {max_model_len} tokens")


class Engine:
    """Continuous-batching generation over one model (see the module docstring).

    Args:
        model: a GPT in eval mode on its device.
        decode: token ids -> text (the tokenizer's decode).
        max_batch_size: sequences decoded together; more wait in arrival order.
        max_model_len: positions per sequence (prompt + generated), at most model.block_size.
        prefix_caching: reuse the cached keys/values of a prompt's leading tokens (`prefix_cache`).
        prefix_cache_slots: extra cache slots that only keep earlier prompts' prefixes.
        speculative: None, or "ngram": n-gram drafts of num_speculative_tokens tokens per row and
            step, verified in the decode pass (`gptforge.infer.speculative`).
        compile_decode: one-token decode passes through compiled static-shape steps
            (`gptforge.infer.engine_compile`; not for speculative passes or with LoRA adapters).

    Use `submit` from any thread; call `step()` yourself or `start()` a background thread.
    Callbacks (`on_event`) run on the engine's thread and must be quick (e.g. queue the event for an
    asyncio loop, which one of `step_hooks` then wakes once for the whole step).

    Raises:
        ValueError: max_model_len above the model's block_size, max_batch_size < 1, an unknown
            speculative method or num_speculative_tokens < 1 with one.
    """

    def __init__(self, model: GPT, decode: Callable[[list[int]], str], max_batch_size: int = 8,
                 max_model_len: int | None = None, prefix_caching: bool = True, prefix_cache_slots: int = 0,
                 speculative: str | None = None, num_speculative_tokens: int = 0, compile_decode: bool = False):
        max_model_len = engine_context(model, max_batch_size, max_model_len)
        self.speculator = make_speculator(speculative, num_speculative_tokens)
        self.model = model.eval()
        self.decode = decode
        self.max_batch_size = max_batch_size
        self.max_model_len = max_model_len
        p = model.norm_f.weight  # not wte: a quantized embedding stores int8
        self.device = p.device
        cfg = model.config
        self.caches = [SlotKVCache(max_batch_size + prefix_cache_slots, cfg.n_kv_head, max_model_len, cfg.head_dim,
                                   p.device, p.dtype) for _ in range(cfg.n_layer)]
        self.prefix = PrefixCache(self.caches, max_batch_size, prefix_cache_slots, prefix_caching)
        self.compiled = CompiledDecode(model, self.caches, max_model_len) if compile_decode else None
        self.free_slots = list(range(max_batch_size))
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._paused = False
        self.steps = 0
        self.stats = EngineStats()
        self.lora: Any = None  # a gptforge.infer.multi_lora.RowAdapters: binds each row's adapter per pass
        self.grammar_vocab: GrammarVocab | None = None
        """The tokenizer for requests with a `grammar` (set by the engine's owner; None: refused)."""
        self.step_hooks: list[Callable[[], None]] = []
        """Called on the engine's thread after each step has delivered its events, e.g. to wake an
        event loop once per step instead of once per event."""

    # ---- requests -----------------------------------------------------------------------------

    def submit(self, prompt: list[int], params: SamplingParams, on_event: Callable[[Event], None]) -> Request:
        """Queue a request; `on_event` receives its Events until one has a finish_reason.

        Raises:
            ValueError: an empty prompt, or prompt + max_tokens longer than max_model_len (naming both);
                a grammar that does not compile (GrammarError) or without a `grammar_vocab`.
        """
        check_request(prompt, params, self.max_model_len)
        seq = Request(prompt, params, on_event, self.decode, self.device)
        if params.grammar is not None:
            if self.grammar_vocab is None:
                raise ValueError("this engine has no grammar_vocab: it cannot follow a grammar")
            seq.constraint = Constraint(self.grammar_vocab, params.grammar)
        with self._cv:
            self.waiting.append(seq)
            self._cv.notify()
        return seq

    def cancel(self, seq: Request) -> None:
        """Stop a sequence; its slot frees at the next step (no event is sent after this)."""
        with self._cv:
            seq.cancelled = True
            self._cv.notify()

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def alive(self) -> bool:
        """False once `stop()` has been called (an in-process engine lives as long as its server)."""
        return not self._stop

    @property
    def num_free_slots(self) -> int:
        """Cache slots no sequence holds (a request admitted at the next step takes one)."""
        return len(self.free_slots)

    # ---- one step -----------------------------------------------------------------------------

    def _release(self, seq: Request) -> None:
        if seq.slot is not None:
            self.prefix.release(seq)
            self.free_slots.append(seq.slot)
            seq.slot = None

    def _finish(self, seq: Request, reason: str, ev: Event) -> None:
        """End `seq` (not by a stop string): emit its held-back text, unless a stop string in it ends it."""
        text, stopped = seq.stops.push(seq.detok.flush())
        ev.text += text + ("" if stopped else seq.stops.flush())
        ev.finish_reason = "stop" if stopped else reason
        seq.finished = True

    @torch.no_grad()
    def step(self) -> bool:
        """Run one scheduling step (see the module docstring). Returns False when there was nothing to do."""
        t0, c0 = time.perf_counter(), time.thread_time()
        with self._cv:
            for seq in [s for s in self.running if s.cancelled or s.finished]:
                self._release(seq)
            self.running = [s for s in self.running if not (s.cancelled or s.finished)]
            self.waiting = collections.deque(s for s in self.waiting if not s.cancelled)
            admitted = []
            self.free_slots.sort()  # lowest slots first: a batch of slots 0..B-1 reads the cache without a copy
            while self.waiting and self.free_slots:
                seq = self.waiting.popleft()
                seq.slot = self.free_slots.pop(0)
                admitted.append(seq)
        decoding = sorted(self.running, key=lambda s: s.slot)
        if not admitted and not decoding:
            return False
        self.steps += 1
        events: list[tuple[Request, Event]] = []
        try:
            if admitted:
                events += self._prefill(admitted)
            if decoding:
                events += self._decode(decoding)
        except BaseException:
            # The caller's error handler frees and answers every running sequence: the ones admitted
            # in this step must be among them, or their slots leak and their clients wait forever.
            with self._cv:
                self.running += admitted
            raise
        with self._cv:
            self.running += admitted
            for seq in self.running:
                if seq.finished:
                    self._release(seq)
            self.running = [s for s in self.running if not s.finished]
        t1 = time.perf_counter()
        for seq, ev in events:
            if not seq.cancelled:
                seq.on_event(ev)
        self._run_hooks()
        st, t2 = self.stats, time.perf_counter()
        st.steps, st.emit_seconds = st.steps + 1, st.emit_seconds + t2 - t1
        st.seconds, st.cpu_seconds = st.seconds + t2 - t0, st.cpu_seconds + time.thread_time() - c0
        return True

    def _forward(self, seqs: list[Request], ids: list[list[int]], filled: list[int],
                 select: list[int] | None = None, last_only: bool = False) -> torch.Tensor:
        """Feed `ids[b]` (equal lengths T: pad shorter ones) to row b at positions filled[b]...

        Returns the logits of every position (B, T, V); with last_only those of the last (B, 1, V);
        with select one position per row, (B, V).
        """
        T = len(ids[0])
        batch = SlotBatch([s.slot for s in seqs], filled, T, self.max_model_len, self.device)
        for c in self.caches:
            c.bind(batch)
        mask = None
        if batch.uniform is None or (T > 1 and batch.uniform > 0):
            # Row b sees its own filled positions and its new ones causally; not the stale rest of its slot.
            key = torch.arange(batch.S, device=self.device)
            mask = (key[None, None, :] <= batch.pos[:, :, None])[:, None]  # (B, 1, T, S)
        # else: rows starting at 0 (causal prefill), or one new token per row with every row filling
        # all S positions: the model's own causal masking hides nothing that should be seen.
        idx = torch.tensor(ids, dtype=torch.long, device=self.device)
        if self.lora is not None:
            self.lora.bind([s.params.adapter for s in seqs], self.device)
        sel = None
        if select is not None:
            sel = (torch.arange(len(seqs), device=self.device), torch.tensor(select, device=self.device))
        return self.model(idx, position_ids=batch.pos, attn_mask=mask, caches=self.caches, select=sel,
                          last_only=last_only)

    def _prefill(self, seqs: list[Request]) -> list[tuple[Request, Event]]:
        """Prefill the sequences admitted in one step: those without prompt_logprobs in one forward
        pass over their prompts, right-padded to the longest (the padding fills slot positions past
        each prompt, which the row's later tokens overwrite and its mask hides meanwhile); each one
        with prompt_logprobs alone, since it needs the logits of every prompt position."""
        t0 = time.perf_counter()
        out: list[tuple[Request, Event]] = []
        for s in seqs:
            self.prefix.plan(s, self.running)
        batch = [s for s in seqs if s.params.prompt_logprobs is None]
        groups = prefill_groups(batch, self.max_model_len)
        for group in groups:  # a reused prefix starts a row's prefill at position s.cached
            T = max(len(s.prompt) - s.cached for s in group)
            ids = [s.prompt[s.cached:] + [0] * (T - len(s.prompt) + s.cached) for s in group]
            logits = self._forward(group, ids, [s.cached for s in group],
                                   select=[len(s.prompt) - s.cached - 1 for s in group]).float()
            out += [(s, self._first_event(s, logits[b], Event(cached_tokens=s.cached))) for b, s in enumerate(group)]
        for s in seqs:
            if s.params.prompt_logprobs is not None:
                logits = self._forward([s], [s.prompt], [0])[0].float()  # (T, V)
                logp = logits[:-1].log_softmax(-1)
                first = Event(prompt_logprobs=[None] + [
                    _logprob_entry(logp[t], s.prompt[t + 1], s.params.prompt_logprobs) for t in range(len(s.prompt) - 1)])
                first.cached_tokens = 0
                out.append((s, self._first_event(s, logits[-1], first)))
        st = self.stats
        st.prefill_passes += len(groups) + len(seqs) - len(batch)
        st.prefill_sequences += len(seqs)
        st.prefix_query_tokens += sum(len(s.prompt) for s in seqs)
        st.prefix_hit_tokens += sum(s.cached for s in seqs)
        st.prefill_seconds += time.perf_counter() - t0
        return out

    def _first_event(self, seq: Request, logits: torch.Tensor, first: Event) -> Event:
        """The first event of `seq` after its prefill, from the logits (V,) of its last prompt token."""
        seq.prefilled = True
        if seq.params.max_tokens == 0:
            self._finish(seq, "length", first)
            return first
        return self._sample(seq, logits, first)

    def _decode(self, seqs: list[Request]) -> list[tuple[Request, Event]]:
        t0 = time.perf_counter()
        st = self.stats
        if self.speculator is not None:  # drafts verified in the pass: several events per row
            out = self.speculator.decode(self, seqs, Event)
        else:
            if self.compiled is not None and self.lora is None:
                logits = self.compiled([s.generated[-1] for s in seqs], [s.length - 1 for s in seqs],
                                       [s.slot for s in seqs]).float()  # (B, V)
            else:
                logits = self._forward(seqs, [[s.generated[-1]] for s in seqs], [s.length - 1 for s in seqs],
                                       last_only=True)[:, -1].float()  # (B, V)
            out = [(s, self._sample(s, logits[b], Event())) for b, s in enumerate(seqs)]
            st.decode_passes += 1
        st.decode_rows += len(seqs)
        st.decode_seconds += time.perf_counter() - t0
        return out

    def _sample(self, seq: Request, logits: torch.Tensor, ev: Event) -> Event:
        """Sample seq's next token from its logits (V,), append it, and fill `ev`."""
        p = seq.params
        raw = logits
        if p.presence_penalty or p.frequency_penalty:
            if seq.counts is None:
                seq.counts = torch.zeros_like(logits)
            logits = logits - p.frequency_penalty * seq.counts - p.presence_penalty * (seq.counts > 0).float()
        if seq.constraint is not None:
            try:
                logits = seq.constraint.mask(logits, p.stop_token_ids)
            except RuntimeError as e:  # this row's grammar failed (a work limit): it alone ends
                ev.finish_reason, ev.error, seq.finished = "error", str(e), True
                return ev
        if p.temperature < MIN_TEMPERATURE:  # a subnormal one would overflow the logits
            tok = int(logits.argmax())
        else:
            filtered = filter_logits(logits[None] / p.temperature, p.top_k or None,
                                     p.top_p if p.top_p < 1.0 else None)
            tok = int(torch.multinomial(filtered.softmax(-1), 1, generator=seq.generator))
        if seq.counts is not None:
            seq.counts[tok] += 1
        if p.logprobs is not None:
            ev.logprob = _logprob_entry(raw.log_softmax(-1), tok, p.logprobs)
        seq.generated.append(tok)
        ev.token_id = tok
        if tok in p.stop_token_ids:
            self._finish(seq, "stop", ev)
            return ev
        text, stopped = seq.stops.push(seq.detok.push(tok))
        ev.text = text
        if stopped:
            ev.finish_reason, seq.finished = "stop", True
        elif seq.constraint is not None and self._grammar_ends(seq, tok, ev):
            pass
        elif len(seq.generated) >= p.max_tokens or seq.length >= self.max_model_len:
            self._finish(seq, "length", ev)
        return ev

    def _grammar_ends(self, seq: Request, tok: int, ev: Event) -> bool:
        """Advance seq's grammar by `tok`; True when that ends seq: the grammar is complete ("stop"), or
        its matcher failed (a lexer or parser work limit: "error", this row alone)."""
        try:
            if not seq.constraint.advance(tok):
                return False
        except RuntimeError as e:
            ev.finish_reason, ev.error, seq.finished = "error", str(e), True
            return True
        self._finish(seq, "stop", ev)
        return True

    # ---- background thread --------------------------------------------------------------------

    def start(self) -> None:
        """Run `step()` in a daemon thread until `stop()`; idle while nothing is queued."""
        if self._thread is not None:
            return
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="gptforge-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the background thread; every unfinished sequence gets a "cancelled" event."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with self._cv:
            left = [s for s in self.running + list(self.waiting) if not (s.finished or s.cancelled)]
            self.running, self.waiting = [], collections.deque()
        for seq in left:
            self._release(seq)
            seq.finished = True
            seq.on_event(Event(finish_reason="cancelled"))
        self._run_hooks()

    def _run_hooks(self) -> None:
        for hook in self.step_hooks:
            hook()

    def pause(self) -> None:
        """Hold the background thread before its next step until `resume()`: submitted requests stay
        waiting (a step already running finishes). Tests fill the queue with it deterministically."""
        with self._cv:
            self._paused = True

    def resume(self) -> None:
        """Let the background thread step again after `pause()`."""
        with self._cv:
            self._paused = False
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and (self._paused or not (self.waiting or self.running)):
                    self._cv.wait()
                if self._stop:
                    return
            try:
                self.step()
            except Exception as e:  # noqa: BLE001 - reported to every affected client, and logged in full
                log.exception("engine step failed")
                with self._cv:
                    failed = [s for s in self.running if not s.finished]
                    for s in failed:
                        self._release(s)
                        s.finished = True
                    self.running = []
                    self.prefix.clear()  # a failed pass may have written part of a slot
                for s in failed:
                    s.on_event(Event(finish_reason="error", error=f"{type(e).__name__}: {e}"))
                self._run_hooks()
