"""The Python library against the hand-made pair and AWS Powertools, one
configuration per run (bench/clients/README.md). Its last line of stdout:
{"seconds": <wall time of the timed part>, "messages": N}.

    --flavour sync   threads sharing one redis.Redis (Idem; the pair and
                     Powertools are sync): what a thread-pool consumer runs
    --flavour async  asyncio tasks sharing one redis.asyncio.Redis
                     (AsyncIdem; the pair with await): an asyncio consumer"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
from typing import Any, Callable

import redis
import redis.asyncio

import redis_idem

WARM = 200


def args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--impl", choices=["idem", "pair", "powertools"], required=True)
    p.add_argument("--scenario", choices=["first", "replay"], required=True)
    p.add_argument("--inflight", type=int, default=1)
    p.add_argument("--messages", type=int, default=2000)
    p.add_argument("--prefix", default="bench:")
    p.add_argument("--edition", choices=["module", "functions"], default="module")
    p.add_argument("--batch", choices=["on", "off"], default=None)
    p.add_argument("--flavour", choices=["sync", "async"], default="sync")
    return p.parse_args()


def work(i: int) -> dict:
    return {"n": i}


# -- sync ----------------------------------------------------------------


def sync_runner(a: argparse.Namespace, client: redis.Redis) -> Callable[[str, int], Any]:
    if a.impl == "idem":
        kwargs = {} if a.batch is None else {"batch": a.batch == "on"}
        idem = redis_idem.Idem(client, edition=a.edition, **kwargs)
        return lambda key, i: idem.process(key, lambda job: work(i))
    if a.impl == "pair":
        def pair(key: str, i: int) -> Any:
            if a.scenario == "replay":
                return json.loads(client.get(key))
            if client.set(key, os.urandom(16), nx=True, px=30000):
                result = work(i)
                client.set(key, json.dumps(result, separators=(",", ":")), xx=True, ex=86400)
                return result
            return json.loads(client.get(key))
        return pair
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import RedisCachePersistenceLayer

    store = RedisCachePersistenceLayer(client=client)

    @idempotent_function(data_keyword_argument="message", persistence_store=store,
                         config=IdempotencyConfig(expires_after_seconds=86400), key_prefix="bench")
    def handle(message: dict) -> dict:
        return work(message["i"])

    return lambda key, i: handle(message={"key": key, "i": i})


def run_sync(a: argparse.Namespace) -> float:
    client = redis.Redis.from_url(a.url, max_connections=max(a.inflight, 1) + 4)
    one = sync_runner(a, client)
    for i in range(WARM):
        one(f"{a.prefix}warm:{i}", i)
    counter = iter(range(a.messages))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            one(f"{a.prefix}{i}", i)

    threads = [threading.Thread(target=worker) for _ in range(a.inflight)]
    started = time.perf_counter()
    if a.inflight == 1:
        worker()
    else:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return time.perf_counter() - started


# -- asyncio -------------------------------------------------------------


def async_runner(a: argparse.Namespace, client: Any) -> Callable[[str, int], Any]:
    if a.impl == "idem":
        kwargs = {} if a.batch is None else {"batch": a.batch == "on"}
        idem = redis_idem.AsyncIdem(client, edition=a.edition, **kwargs)

        async def one(key: str, i: int) -> Any:
            return await idem.process(key, lambda job: work(i))
        return one
    if a.impl == "pair":
        async def pair(key: str, i: int) -> Any:
            if a.scenario == "replay":
                return json.loads(await client.get(key))
            if await client.set(key, os.urandom(16), nx=True, px=30000):
                result = work(i)
                await client.set(key, json.dumps(result, separators=(",", ":")), xx=True, ex=86400)
                return result
            return json.loads(await client.get(key))
        return pair
    raise SystemExit("powertools: sync only (its Redis layer is redis-py's sync client)")


async def run_async(a: argparse.Namespace) -> float:
    client = redis.asyncio.Redis.from_url(a.url, max_connections=max(a.inflight, 1) + 4)
    one = async_runner(a, client)
    for i in range(WARM):
        await one(f"{a.prefix}warm:{i}", i)
    counter = iter(range(a.messages))

    async def worker() -> None:
        for i in counter:
            await one(f"{a.prefix}{i}", i)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(a.inflight)))
    seconds = time.perf_counter() - started
    await client.aclose()
    return seconds


def main() -> None:
    a = args()
    cpu = time.process_time()
    seconds = asyncio.run(run_async(a)) if a.flavour == "async" else run_sync(a)
    # Besides the wall time, this process's CPU over the run (the warm-up
    # included): on a loaded machine the wall time is mostly waiting for a core.
    print(json.dumps({"seconds": seconds, "messages": a.messages, "cpu_seconds": time.process_time() - cpu}))


if __name__ == "__main__":
    main()
