"""process_many(keys, work) without I/O: the single call's steps (`_loop`)
over a batch, keeping every promise of the single call: one claim batch
(one WAIT under `durable`), one heartbeat, the failures released in one
RELEASE batch, the successes completed in one DONE batch sent exactly
once per try, resent on a lost reply and confirmed with IDEM.GET per key,
DoneUnconfirmed per key after done_retries."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import redis

from ._errors import (BusyError, DoneUnconfirmedError, ExhaustedError, HookError, KeyT, MismatchError,
                      NotDurableError, ResultNotStoredError, ResultTooLargeError, StaleError, not_run)
from ._job import BatchItem, Flow, Job, Send, Sleep, StartBeat, StopBeat, Work, cmd
from ._loop import CONNECTION_LOST, Loop, lease_left, resend_pause
from ._replies import BatchStatus, DoneReply, Status
from ._settings import Settings, quiet
from ._wire import Group


def split_waits(groups: Sequence[Group], answers: List[Any], durable: bool) -> Tuple[List[Any], List[Any]]:
    """The answers of `groups` as (one per batch call, the WAIT answer for
    each batch call): each group ends with its WAIT under `durable`."""
    calls: List[Any] = []
    waits: List[Any] = []
    pos = 0
    for group in groups:
        n = len(group.calls) - (1 if durable else 0)
        calls += answers[pos : pos + n]
        waits += [answers[pos + n] if durable else None] * n
        pos += len(group.calls)
    return calls, waits


def per_item(batch: Any, waits: List[Any]) -> List[Any]:
    out: List[Any] = [None] * batch.size
    for indexes, wait in zip(batch.answers, waits):
        for i in indexes:
            out[i] = wait
    return out


def process_many(loop: Loop, keys: Sequence[KeyT], payloads: Optional[Sequence[Any]], s: Settings) -> Flow:
    keys = list(keys)
    if payloads is not None and len(payloads) != len(keys):
        raise ValueError("payloads: one per key")
    replies, acks = yield from _claim_all(loop, keys, payloads, s)
    items = [BatchItem(key) for key in keys]
    held: List[tuple] = []  # (job, item)
    refused: List[tuple] = []  # on_run raised: released with the failures
    unacked: List[tuple] = []  # durable: granted but not acknowledged
    for i, (item, reply) in enumerate(zip(items, replies)):
        if isinstance(reply, Exception):
            item.error = reply
            continue
        item.attempt = reply.attempt
        try:
            if reply.status is Status.DONE:
                try:
                    replay = loop.replay(item.key, reply, s, acks[i])
                except NotDurableError as e:  # the stored result, not acknowledged by the replicas
                    item.status, item.error, item.value = BatchStatus.NOT_DURABLE, e, e.result
                    item.result_stored = reply.result is not None
                    continue
                item.status, item.value, item.result_stored = BatchStatus.REPLAYED, replay.value, replay.result_stored
            elif reply.status is Status.BUSY:  # not waited for
                loop.stats.add("busy")
                quiet(loop.hooks.on_busy, item.key, lease_left(reply))
                item.status, item.error = BatchStatus.BUSY, BusyError(item.key, lease_left(reply), reply.attempt)
            else:
                loop.refuse(item.key, reply)
                job = Job(item.key, reply, s.lease, None if payloads is None else payloads[i], loop.stats, loop.hooks)
                if s.durable is not None and not s.durable.acknowledged(acks[i])[0]:
                    unacked.append((job, item, i))
                    continue
                loop.stats.add("first_runs" if reply.status is Status.NEW else "retries")
                try:
                    loop.run_hook(job)
                    held.append((job, item))
                except HookError as e:
                    item.status, item.error = BatchStatus.FAILED, e
                    refused.append((job, item))
        except MismatchError as e:
            item.status, item.error = BatchStatus.MISMATCH, e
        except ExhaustedError as e:
            item.status, item.error = BatchStatus.EXHAUSTED, e
        except Exception as e:  # a stored result the codec cannot decode
            item.error = e
    if unacked and s.durable is not None:
        yield from loop.release([j for j, _, _ in unacked], None, s)
        for job, item, i in unacked:
            loop.stats.add("not_durable")
            item.status = BatchStatus.NOT_DURABLE
            item.error = NotDurableError(job.key, "claim", s.durable.acknowledged(acks[i])[1], s.durable.replicas,
                                         attempt=job.attempt)
    beat = (yield StartBeat([j for j, _ in held], s.beat_every)) if held and s.beat_every > 0 else None
    finished: List[tuple] = []
    failed: List[tuple] = list(refused)
    interrupted: Optional[BaseException] = None  # KeyboardInterrupt, cancellation: the rest do not run
    for job, item in held:
        if interrupted is not None:
            item.status, item.error = BatchStatus.FAILED, interrupted
            failed.append((job, item))
            continue
        try:
            item.value = yield Work(job)
            finished.append((job, item))
        except BaseException as e:
            item.status, item.error = BatchStatus.FAILED, e
            failed.append((job, item))
            if not isinstance(e, Exception):
                interrupted = e
    if beat is not None:
        yield StopBeat(beat)
    # Settled before an interruption goes on: the claims given back, the works that returned completed.
    if failed:
        yield from loop.release([j for j, _ in failed], [it.error for _, it in failed], s)
    if finished:
        yield from _complete_all(loop, finished, s)
    if interrupted is not None:
        raise interrupted
    return items


def _claim_all(loop: Loop, keys: List[KeyT], payloads: Optional[Sequence[Any]], s: Settings) -> Flow:
    owner = s.owner_name
    if s.durable is None:
        replies = yield cmd("claim_many", keys, s.lease, payloads=payloads, max_tries=s.max_tries, bloom=s.bloom,
                            owner=owner)
        return replies, [None] * len(keys)
    batch = loop.protocol.claim_many(keys, s.lease, payloads, s.max_tries, s.bloom, loop.cluster, owner)
    groups = loop.groups(batch, keys, s.durable)
    answers = yield Send(groups, s.durable.timeout + (loop.socket_timeout or 5.0))
    calls, waits = split_waits(groups, answers, True)
    # A group whose connection failed: its keys' error (a granted claim lapses with its lease).
    return batch.finish(calls), per_item(batch, waits)


def _complete_all(loop: Loop, finished: List[tuple], s: Settings) -> Flow:
    """Complete the works that returned in one DONE batch, sent once per
    try; a lost reply sends it again (done_retries), a result refused as
    too large goes again without it."""
    encoded = [loop.encode(item.value, s) for _, item in finished]
    results = [data for data, _ in encoded]
    too_large: Dict[int, BaseException] = {}
    answers: Dict[int, Any] = {}
    acks: Dict[int, Any] = {}
    tries = [0] * len(finished)
    todo = list(range(len(finished)))
    timeout = s.done_timeout + (s.durable.timeout if s.durable else 0.0)
    while todo:
        items = [(finished[i][0].key, finished[i][0].token, results[i]) for i in todo]
        batch = loop.protocol.done_many(items, s.retain, s.bloom, loop.cluster)
        groups = loop.groups(batch, [k for k, _, _ in items], s.durable)
        calls, waits = split_waits(groups, (yield Send(groups, timeout)), s.durable is not None)
        replies, item_waits = batch.finish(calls), per_item(batch, waits)
        again, lost = [], False
        for i, reply, wait in zip(todo, replies, item_waits):
            if isinstance(reply, ResultTooLargeError) and results[i] is not None:
                results[i], too_large[i] = None, reply
                again.append(i)
            elif isinstance(reply, CONNECTION_LOST) or (isinstance(reply, redis.ResponseError) and not_run(reply)):
                if tries[i] >= s.done_retries:
                    job, item = finished[i]
                    answers[i] = DoneUnconfirmedError(job.key, item.value, reply, job.attempt)
                else:
                    tries[i] += 1
                    again.append(i)
                    lost = True
            else:
                answers[i], acks[i] = reply, wait
        if lost:
            yield Sleep(resend_pause(max(tries) - 1))
        todo = again
    for i, (job, item) in enumerate(finished):
        yield from _settle(loop, job, item, answers[i], acks.get(i), results[i], encoded[i][1], too_large.get(i),
                           tries[i], s)


def _settle(loop: Loop, job: Job, item: BatchItem, reply: Any, acked: Any, result: Any, unencodable: Any,
            too_large: Any, tries: int, s: Settings) -> Flow:
    if isinstance(reply, DoneReply) and reply.already_done and tries:  # ours, if resent (see _loop)
        try:
            record = yield from loop.own_completion(job, item.value, s)
        except DoneUnconfirmedError as e:
            item.status, item.error = BatchStatus.ERROR, e
            return
        if record is not None:
            reply = DoneReply(1 if record.result is not None or result is None else 3)
    if isinstance(reply, StaleError) or (isinstance(reply, DoneReply) and reply.already_done):
        item.status, item.error = BatchStatus.LOST, job._lose()
        return
    if isinstance(reply, Exception):
        item.status, item.error = BatchStatus.ERROR, reply
        return
    item.status = BatchStatus.PROCESSED
    item.result_stored = result is not None and reply.result_stored
    loop.stats.add("completed")
    loop.dropped(job, unencodable, too_large, item.result_stored)
    try:
        loop.done_hook(job, item.value, item.result_stored)
    except HookError as e:
        item.error = e
        return
    if s.durable is not None:
        enough, count = s.durable.acknowledged(acked)
        if not enough:
            loop.stats.add("not_durable")
            item.status = BatchStatus.NOT_DURABLE
            item.error = NotDurableError(job.key, "done", count, s.durable.replicas, item.value, job.attempt)
            return
    if unencodable is not None:
        item.error = ResultNotStoredError(job.key, item.value, unencodable, job.attempt)
    elif too_large is not None and s.oversize == "error":
        item.error = ResultNotStoredError(job.key, item.value, too_large, job.attempt)
