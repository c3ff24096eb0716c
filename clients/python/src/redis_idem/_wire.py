"""Commands sent exactly once, pipelined on one connection: a DONE (with
its WAIT under `durable`), a RELEASE, a durable CLAIM and its WAIT. The
client's own retries resend a command after a connection error (redis-py
6+ by default, up to 10 times); the loop's contract is that at most
1 + done_retries DONEs reach the server, each within done_timeout, and a
WAIT runs on the connection of the command it waits for. So these take a
connection of the client's pool (the key's node's in a cluster, the
current primary's behind Sentinel), send once, read with a deadline, and
give it back; a connection error disconnects it and goes to the loop."""

from __future__ import annotations

import time
from typing import Any, List, NamedTuple, Sequence

import redis

from ._errors import translate
from ._protocol import Call, KeyT


class Group(NamedTuple):
    """Commands for one connection: `route` is the (prefixed) key whose node runs them."""

    route: KeyT
    calls: List[Call]


def _answer(call: Call, reply: Any) -> Any:
    return translate(reply) if isinstance(reply, redis.ResponseError) else call[1](reply)


def _flat(groups: Sequence[Group], per_group: List[List[Any]]) -> List[Any]:
    return [answer for answers in per_group for answer in answers]


def _lost(error: BaseException) -> BaseException:
    if isinstance(error, (redis.ConnectionError, redis.TimeoutError)):
        return error
    lost = redis.ConnectionError(f"connection lost: {error!r}")
    lost.__cause__ = error
    return lost


# -- sync ----------------------------------------------------------------


def _sync_target(client: Any, cluster: bool, route: KeyT) -> Any:
    if cluster:
        return client.get_redis_connection(client.get_node_from_key(route))
    return client


def _sync_group(client: Any, cluster: bool, group: Group, deadline: float) -> List[Any]:
    target = _sync_target(client, cluster, group.route)
    pool = target.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_packed_command(conn.pack_commands([args for args, _ in group.calls]))
        answers = []
        for call in group.calls:
            try:
                reply = conn.read_response(timeout=max(0.001, deadline - time.monotonic()))
            except redis.ResponseError as e:
                reply = e
            answers.append(_answer(call, reply))
        return answers
    except BaseException as e:
        conn.disconnect()
        if isinstance(e, Exception):
            raise _lost(e) from e
        raise
    finally:
        pool.release(conn)


def _moved(answers: List[Any]) -> bool:
    return any(isinstance(a, (redis.exceptions.MovedError, redis.exceptions.AskError)) for a in answers)


def send_sync(client: Any, cluster: bool, groups: Sequence[Group], timeout: float) -> List[Any]:
    """Every group's calls once, each group on one connection: one answer
    per call, in order (the parsed reply or the typed error); a group whose
    connection failed answers that error for each of its calls. In a
    cluster, a lost node or a MOVED answer (a failover, a resharding) makes
    the client ask the cluster again before the loop resends."""
    deadline = time.monotonic() + timeout
    per_group: List[List[Any]] = []
    for group in groups:
        try:
            answers = _sync_group(client, cluster, group, deadline)
        except (redis.ConnectionError, redis.TimeoutError) as e:
            answers = [e] * len(group.calls)
        if cluster and (isinstance(answers[0], (redis.ConnectionError, redis.TimeoutError)) or _moved(answers)):
            try:
                client.nodes_manager.initialize()
            except redis.RedisError:
                pass
        per_group.append(answers)
    return _flat(groups, per_group)


# -- asyncio -------------------------------------------------------------


async def _async_group(client: Any, cluster: bool, group: Group, deadline: float) -> List[Any]:
    if cluster:
        node = client.get_node_from_key(group.route)
        conn = node.acquire_connection()
        release = node.release
    else:
        pool = client.connection_pool
        conn = await pool.get_connection()
        release = pool.release
    try:
        await conn.send_packed_command(conn.pack_commands([args for args, _ in group.calls]))
        answers = []
        for call in group.calls:
            try:
                reply = await conn.read_response(timeout=max(0.001, deadline - time.monotonic()))
            except redis.ResponseError as e:
                reply = e
            answers.append(_answer(call, reply))
        return answers
    except BaseException as e:
        await conn.disconnect()
        if isinstance(e, Exception):
            raise _lost(e) from e
        raise
    finally:
        released = release(conn)
        if released is not None:
            await released


async def send_async(client: Any, cluster: bool, groups: Sequence[Group], timeout: float) -> List[Any]:
    """As send_sync, for the asyncio clients."""
    deadline = time.monotonic() + timeout
    per_group: List[List[Any]] = []
    for group in groups:
        try:
            answers = await _async_group(client, cluster, group, deadline)
        except (redis.ConnectionError, redis.TimeoutError) as e:
            answers = [e] * len(group.calls)
        if cluster and (isinstance(answers[0], (redis.ConnectionError, redis.TimeoutError)) or _moved(answers)):
            try:
                await client.nodes_manager.initialize()
            except redis.RedisError:
                pass
        per_group.append(answers)
    return _flat(groups, per_group)
