"""A replay under `durable` waits for its replicas too (docs/clients.md,
Durability): on a primary without replicas, a key completed by the typed
commands (which send no WAIT) replays as NotDurableError at the done
stage, carrying the stored result; the work never runs, nothing is
released; process_many's item alike. Sync and asyncio."""

import asyncio

import redis
import redis.asyncio

import redis_idem as ri


def complete(r: redis.Redis, ns: str, *keys: str) -> None:
    commands = ri.IdemCommands(r, prefix=ns)
    for key in keys:
        claim = commands.claim(key, 60)
        assert commands.done(key, claim.token, result=b'"stored"')


def not_durable_replay(error: ri.NotDurableError) -> bool:
    return error.stage == "done" and error.result == "stored" and error.acknowledged == 0


def test_a_replay_not_acknowledged_is_not_durable(r, ns):  # type: ignore[no-untyped-def]
    complete(r, ns, "k", "m")
    idem = ri.Idem(r, prefix=ns, durable=ri.Durable(replicas=1, timeout=0.05))
    runs = []
    try:
        idem.process("k", lambda job: runs.append(job) or "again")
        raise AssertionError("a replay not acknowledged returned")
    except ri.NotDurableError as e:
        assert not_durable_replay(e), vars(e)
    [item] = idem.process_many(["m"], lambda job: runs.append(job) or "again")
    assert item.status is ri.BatchStatus.NOT_DURABLE and item.value == "stored" and not_durable_replay(item.error)
    assert runs == []
    assert idem.stats.not_durable == 2 and idem.stats.replays == 0 and idem.stats.released == 0
    assert ri.IdemCommands(r, prefix=ns).get("k").state is ri.RecordState.DONE
    # Acknowledged (no replica asked): a replay as before.
    assert ri.Idem(r, prefix=ns, durable=ri.Durable(replicas=0)).process("k", lambda job: "again") == "stored"


def test_an_async_replay_not_acknowledged_is_not_durable(server, r, ns):  # type: ignore[no-untyped-def]
    complete(r, ns, "k")

    async def main() -> None:
        client = redis.asyncio.Redis(port=server.port)
        idem = ri.AsyncIdem(client, prefix=ns, durable=ri.Durable(replicas=1, timeout=0.05))
        try:
            await idem.process("k", lambda job: "again")
            raise AssertionError("a replay not acknowledged returned")
        except ri.NotDurableError as e:
            assert not_durable_replay(e), vars(e)
        finally:
            await client.aclose()

    asyncio.run(main())
