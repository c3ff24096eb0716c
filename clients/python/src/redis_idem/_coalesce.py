"""One batch per tick (`batch=True`): concurrent calls on one instance
share a batch command. The first call of a lane sends at once (no added
latency alone); the calls that arrive while it is in flight queue, and
when it returns the first of them is handed the queue and sends it as one
command, answering each its own element. A lane is calls that can share a
command: claims with the same lease, MAXTRIES, BLOOM and OWNER (and all
with or all without a PAYLOAD), or DONEs with the same RETAIN and BLOOM."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable, Dict, Hashable, List, Optional


class _Slot:
    __slots__ = ("entry", "answer", "lead", "wake")

    def __init__(self, entry: Any, wake: Any = None):
        self.entry = entry
        self.answer: Any = None
        self.lead: Optional[List["_Slot"]] = None  #: the queue this call is handed to send
        self.wake = wake


class Lanes:
    """The lanes' queues, without I/O: `join` says whether a call sends
    now; `handoff` takes what queued while a command was in flight."""

    def __init__(self) -> None:
        self._queued: Dict[Hashable, List[_Slot]] = {}

    def join(self, lane: Hashable, slot: _Slot) -> bool:
        """True: the lane was idle, this call sends now (alone)."""
        queue = self._queued.get(lane)
        if queue is None:
            self._queued[lane] = []
            return True
        queue.append(slot)
        return False

    def handoff(self, lane: Hashable) -> List[_Slot]:
        """What queued while the lane's command was in flight (the next
        batch), or [] and the lane idle again."""
        queue = self._queued[lane]
        if queue:
            self._queued[lane] = []
        else:
            del self._queued[lane]
        return queue


def _answers(send: Callable[[List[Any]], List[Any]], batch: List[_Slot]) -> List[Any]:
    try:
        return send([slot.entry for slot in batch])
    except BaseException as e:  # the command failed whole: each caller gets its error
        return [e] * len(batch)


class SyncBatcher:
    """Lanes for threads sharing a sync Idem."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lanes = Lanes()

    def submit(self, lane: Hashable, entry: Any, send: Callable[[List[Any]], List[Any]]) -> Any:
        """`send(entries)` answers one element per entry (a reply or an
        error); this call's element comes back (an error as a value)."""
        me = _Slot(entry)
        with self._lock:
            now = self._lanes.join(lane, me)
            if not now:
                me.wake = threading.Event()
        if now:
            batch = [me]
        else:
            me.wake.wait()
            if me.lead is None:
                return me.answer
            batch = me.lead
        while True:
            answers = _answers(send, batch)
            with self._lock:
                queued = self._lanes.handoff(lane)
            for slot, answer in zip(batch, answers):
                if slot is me:
                    mine = answer
                else:
                    slot.answer = answer
                    slot.wake.set()
            if queued:
                queued[0].lead = queued
                queued[0].wake.set()
            return mine


class AsyncBatcher:
    """Lanes for asyncio tasks sharing an AsyncIdem (one event loop). A
    queued task cancelled while it waits is left out of the batch; one
    cancelled as it is handed the queue hands it on."""

    def __init__(self) -> None:
        self._lanes = Lanes()

    async def submit(self, lane: Hashable, entry: Any, send: Callable[[List[Any]], Awaitable[List[Any]]]) -> Any:
        me = _Slot(entry)
        if self._lanes.join(lane, me):
            batch = [me]
        else:
            me.wake = asyncio.get_running_loop().create_future()
            try:
                await me.wake
            except asyncio.CancelledError:
                if me.lead is not None:
                    self._pass(lane, [slot for slot in me.lead if slot is not me])
                raise
            if me.lead is None:
                return me.answer
            batch = [slot for slot in me.lead if slot is me or not slot.wake.done()]
        try:
            answers = await send([slot.entry for slot in batch])
        except BaseException as e:
            answers = [e] * len(batch)
            if not isinstance(e, Exception):  # cancelled: the others still get their answer and a leader
                self._answer(lane, batch, answers, me)
                raise
        return self._answer(lane, batch, answers, me)

    def _answer(self, lane: Hashable, batch: List[_Slot], answers: List[Any], me: _Slot) -> Any:
        mine = None
        for slot, answer in zip(batch, answers):
            if slot is me:
                mine = answer
            elif not slot.wake.done():
                slot.answer = answer
                slot.wake.set_result(None)
        self._pass(lane, self._lanes.handoff(lane))
        return mine

    def _pass(self, lane: Hashable, queued: List[_Slot]) -> None:
        """Hand the queue to its first task still waiting (the lane stays in flight), or idle the lane."""
        while queued:
            live = [slot for slot in queued if not slot.wake.done()]
            if live:
                live[0].lead = live
                live[0].wake.set_result(None)
                return
            queued = self._lanes.handoff(lane)
