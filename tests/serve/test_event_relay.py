"""Engine events reach the event loop one batch per wake-up (EventRelay), and a stream writes the
events that have piled up in one string (coalesce)."""

from __future__ import annotations

import asyncio
import threading

from gptforge.serve.server import EventRelay, coalesce


def test_one_wake_delivers_every_pushed_event_with_one_loop_callback():
    async def main():
        loop = asyncio.get_running_loop()
        relay = EventRelay(loop)
        calls = {"n": 0}
        real = loop.call_soon_threadsafe

        def counting(cb, *args):
            calls["n"] += 1
            return real(cb, *args)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        queues = [asyncio.Queue(), asyncio.Queue()]

        def engine_step(k):  # what the engine thread does in one step: push every event, then wake
            for i in range(3):
                relay.push(queues[i % 2], (k, i))
            relay.wake()
            relay.wake()  # a second wake before the delivery ran schedules nothing more

        t = threading.Thread(target=engine_step, args=(0,))
        t.start()
        t.join()
        assert calls["n"] == 1 and queues[0].empty()  # nothing is delivered before the loop runs
        await asyncio.sleep(0)
        assert [queues[0].get_nowait(), queues[0].get_nowait()] == [(0, 0), (0, 2)]
        assert queues[1].get_nowait() == (0, 1)
        relay.wake()  # nothing pending: no callback
        engine_step(1)
        await asyncio.sleep(0)
        assert calls["n"] == 2 and queues[1].get_nowait() == (1, 1)

    asyncio.run(main())


def test_coalesce_joins_chunks_while_events_wait_and_closes_the_stream():
    class Sub:
        queue: asyncio.Queue

    async def main():
        sub = Sub()
        sub.queue = asyncio.Queue()
        closed = []

        async def chunks():
            try:
                for i in range(4):
                    # Events 1 and 2 are already queued when chunk 0 and chunk 1 are made.
                    if i == 0:
                        sub.queue.put_nowait("e1")
                        sub.queue.put_nowait("e2")
                    elif i in (1, 2):
                        sub.queue.get_nowait()
                    yield f"c{i};"
            finally:
                closed.append(True)

        out = [s async for s in coalesce(sub, chunks())]
        assert out == ["c0;c1;c2;", "c3;"] and closed == [True]

    asyncio.run(main())
