"""The asyncio adapters' one loop: `concurrency` workers, each message
fetched only once a worker is free to start it (a message that waits in a
local buffer would outlive its broker's deadline), no task per message."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, List, Optional

#: How often a loop with every worker busy looks at stop().
STOP_CHECK_S = 0.5


async def pump(fetch: Callable[[int], Awaitable[List[Any]]], handle: Callable[[Any], Awaitable[Any]],
               concurrency: int, stopping: Callable[[], bool]) -> None:
    """Until stopping(): fetch(n) up to n messages for the n free workers,
    each handled by handle(message). Then the messages in hand are
    finished. What a handle raises (an adapter's own failure, never a
    message's) stops the loop and is raised."""
    queue: "asyncio.Queue[Any]" = asyncio.Queue()
    free = concurrency
    wake = asyncio.Event()
    failed: List[BaseException] = []

    async def worker() -> None:
        nonlocal free
        while True:
            message = await queue.get()
            if message is None:
                return
            try:
                await handle(message)
            except BaseException as e:  # noqa: B902 - raised again by pump()
                failed.append(e)
            finally:
                free += 1
                wake.set()

    workers = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
    try:
        while not stopping() and not failed:
            if free == 0:
                wake.clear()
                try:
                    await asyncio.wait_for(wake.wait(), STOP_CHECK_S)
                except asyncio.TimeoutError:
                    pass
                continue
            messages = await fetch(free)
            free -= len(messages)
            for message in messages:
                queue.put_nowait(message)
    finally:
        for _ in workers:
            queue.put_nowait(None)
        await asyncio.gather(*workers, return_exceptions=True)
    error: Optional[BaseException] = failed[0] if failed else None
    if error is not None:
        raise error
