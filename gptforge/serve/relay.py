"""Engine events handed to an asyncio event loop a step at a time (`EventRelay`)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class EventRelay:
    """Hands engine events (from the engine's thread) to asyncio queues on one event loop, a step at
    a time: `push` only stores them; `wake` (an engine step hook, run after the step has pushed all
    of its events) schedules one `call_soon_threadsafe` that delivers them all. A step's events for
    every stream thus cost one wake-up of the loop (a write to its self-pipe), not one per token, and
    the loop wakes after the engine has finished with them, not in the middle. While a delivery is
    scheduled and has not run yet (the loop is behind), later steps' events join it without another
    wake-up, and a stream then finds several events at once (`coalesce` sends them in one write).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[asyncio.Queue, Any]] = []
        self._scheduled = False

    def push(self, queue: asyncio.Queue, item) -> None:
        """Hold `item` for `queue` until the next `wake` (callable from any thread)."""
        with self._lock:
            self._pending.append((queue, item))

    def wake(self) -> None:
        """Deliver everything pushed so far on the loop's thread (callable from any thread)."""
        with self._lock:
            if not self._pending or self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the event loop has closed: the server is shutting down
            pass

    def _deliver(self) -> None:
        with self._lock:
            items, self._pending, self._scheduled = self._pending, [], False
        for queue, item in items:
            queue.put_nowait(item)
