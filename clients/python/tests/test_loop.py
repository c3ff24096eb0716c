"""The consumer loop beyond the conformance cases: what the caller gets back
(its own object, or the codec's round trip), the hooks' arguments, the
counters' shape, a WAIT that blocks on the server, a worker killed for
real, the settings' units, and batches of more than 10000 keys."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

import redis_idem as ri
from redis_idem import RecordState, Status


@pytest.fixture
def idem(r, ns):  # type: ignore[no-untyped-def]
    return ri.Idem(r, prefix=ns, lease=5, wait=5)


def test_a_first_run_returns_its_own_object_a_replay_its_json_round_trip(idem):  # type: ignore[no-untyped-def]
    mine = (1, {"at": "now"})
    first = idem.process("own", lambda job: mine)
    assert first is mine  # the very object, not a decoding of it
    assert idem.process("own", lambda job: "not run") == [1, {"at": "now"}]  # the tuple comes back a list


def test_hooks_get_what_docs_clients_md_says(idem, r):  # type: ignore[no-untyped-def]
    seen = []
    idem.hooks = ri.Hooks(
        on_run=lambda job: seen.append(("run", job.key, job.status, job.attempt)),
        on_replay=lambda key, attempt: seen.append(("replay", key, attempt)),
        on_busy=lambda key, lease_left: seen.append(("busy", key, 0 < lease_left <= 30)),
        on_done=lambda job, stored: seen.append(("done", job.key, stored)),
        on_release=lambda job, error: seen.append(("release", job.key, str(error))),
        on_result_dropped=lambda job, reason: seen.append(("dropped", job.key, reason)),
    )
    assert idem.process("a", lambda job: 1) == 1
    idem.process("a", lambda job: 2)
    with pytest.raises(ValueError):
        idem.process("f", lambda job: (_ for _ in ()).throw(ValueError("no")))
    with pytest.raises(ri.ResultNotStoredError) as e:
        idem.process("u", lambda job: b"bytes are not JSON")
    assert e.value.result == b"bytes are not JSON" and isinstance(e.value.cause, TypeError)
    idem.commands.claim("held", 30)
    with pytest.raises(ri.BusyError) as busy:
        idem.process("held", lambda job: 0, wait=0.2)
    assert 20 < busy.value.lease_left <= 30
    assert seen == [
        ("run", "a", Status.NEW, 1), ("done", "a", True),
        ("replay", "a", 1),
        ("run", "f", Status.NEW, 1), ("release", "f", "no"),
        ("run", "u", Status.NEW, 1), ("dropped", "u", "unserializable"), ("done", "u", False),
        ("busy", "held", True),  # once, however many polls or WAITs
    ]
    counts = idem.stats.as_dict()
    assert set(counts) == {"first_runs", "retries", "replays", "waits", "busy", "completed", "released",
                           "leases_lost", "results_dropped", "mismatches", "exhausted", "extends", "not_durable"}
    assert (idem.stats.first_runs, idem.stats.completed, idem.stats.waits, idem.stats.busy) == (3, 2, 1, 1)


def test_a_hook_that_only_notifies_cannot_change_the_outcome(idem):  # type: ignore[no-untyped-def]
    def fail(*args):  # type: ignore[no-untyped-def]
        raise RuntimeError("ignored")

    idem.hooks = ri.Hooks(on_replay=fail, on_release=fail, on_busy=fail)
    idem.process("r", lambda job: "v")
    assert idem.process("r", lambda job: "w") == "v"
    with pytest.raises(KeyError):
        idem.process("x", lambda job: {}["missing"])
    assert idem.commands.get("x").state is RecordState.RELEASED


def test_an_async_hook_is_refused_since_it_would_never_be_awaited():  # type: ignore[no-untyped-def]
    async def on_run(job):  # type: ignore[no-untyped-def]
        pass

    class Notifier:
        async def __call__(self, key, attempt):  # type: ignore[no-untyped-def]
            pass

    with pytest.raises(TypeError, match="Hooks.on_run: a hook is called, never awaited"):
        ri.Hooks(on_run=on_run)
    hooks = ri.Hooks(on_done=lambda job, stored: None)
    with pytest.raises(TypeError, match="Hooks.on_replay"):
        hooks.on_replay = Notifier()
    with pytest.raises(TypeError, match="Hooks.on_done"):
        hooks.on_done = on_run
    assert hooks.on_replay is None and hooks.on_done is not None


def test_a_wait_on_the_module_blocks_on_the_server(idem, r, module):  # type: ignore[no-untyped-def]
    if not module:
        pytest.skip("the Functions edition polls; the conformance case wait-gets-holders-result covers it")
    holder = idem.commands.claim("b", 30)
    woken = r.info("idem")["idem_wait_done"]
    threading.Timer(0.3, lambda: idem.commands.done("b", holder.token, result=b'"first"')).start()
    assert idem.process("b", lambda job: "second") == "first"
    # One CLAIM without WAIT (BUSY), then one CLAIM ... WAIT woken by the DONE.
    assert r.info("idem")["idem_wait_done"] == woken + 1
    assert (idem.stats.waits, idem.stats.busy, idem.stats.replays) == (1, 0, 1)


def test_a_done_never_confirmed_is_done_unconfirmed_carrying_the_result(server, r, ns, module):  # type: ignore[no-untyped-def]
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from conformance import Proxy

    proxy = Proxy(server.port)
    # Without redis-py's own retries, so that the loop's done_retries are all the resends.
    client = redis.Redis(host="127.0.0.1", port=proxy.port, retry=Retry(NoBackoff(), 0))
    try:
        idem = ri.Idem(client, prefix=ns, done_retries=2)
        proxy.arm(b"IDEM.DONE" if module else b"idem_done", times=3)  # every DONE's reply lost
        mine = {"charged": 5}
        with pytest.raises(ri.DoneUnconfirmedError) as e:
            idem.process("cut", lambda job: mine)
        assert e.value.result is mine and isinstance(e.value.cause, redis.ConnectionError)
        # The server ran the first DONE: the redelivery replays, nothing runs twice.
        assert idem.process("cut", lambda job: "again") == {"charged": 5}
        assert (idem.stats.first_runs, idem.stats.completed, idem.stats.replays) == (1, 0, 1)
    finally:
        client.close()
        proxy.close()


def test_an_interrupted_batch_settles_every_claim_before_the_interruption_goes_on(idem):  # type: ignore[no-untyped-def]
    def work(job):  # type: ignore[no-untyped-def]
        if job.key == "{i}2":
            raise KeyboardInterrupt
        return job.key

    with pytest.raises(KeyboardInterrupt):
        idem.process_many(["{i}1", "{i}2", "{i}3"], work)
    states = [idem.commands.get(k).state for k in ("{i}1", "{i}2", "{i}3")]
    assert states == [RecordState.DONE, RecordState.RELEASED, RecordState.RELEASED]  # none left processing


@pytest.mark.long
def test_heartbeat_keeps_a_30_second_job_under_a_2_second_lease(idem):  # type: ignore[no-untyped-def]
    # Costs 30 s, so client.mk runs it on one server only (Redis 7.0, the
    # module); the conformance case heartbeat-keeps-long-work runs a short
    # one everywhere.
    other = ri.Idem(idem.client, prefix=idem.commands.prefix, wait=0)

    def work(job):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(2)
            with pytest.raises(ri.BusyError):
                other.process("long", lambda j: "stolen")
            job.check()
        return "30 s of work"

    assert idem.process("long", work, lease=2) == "30 s of work"
    assert idem.stats.leases_lost == 0 and idem.stats.extends >= 40


def test_killed_worker_lease_lapses_and_the_next_worker_retries(server, r, ns):  # type: ignore[no-untyped-def]
    here = Path(__file__).parent
    proc = subprocess.Popen([sys.executable, str(here / "worker_proc.py"), server.url, ns + "killed", "1"],
                            stdout=subprocess.PIPE, text=True)  # the installed redis_idem
    try:
        assert proc.stdout.readline().strip() == "working attempt=1"
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)
    finally:
        proc.kill()
        proc.stdout.close()
    idem = ri.Idem(r, prefix=ns, wait=5)
    seen = []
    assert idem.process("killed", lambda job: seen.append((job.status, job.attempt)) or "redone") == "redone"
    assert seen == [(Status.RETRY, 2)]


def test_durations_are_whole_seconds_and_checked_before_sending(r, ns):  # type: ignore[no-untyped-def]
    for bad in ({"lease": 0}, {"lease": 1.5}, {"retain": 0}, {"oversize": "raise"}):
        with pytest.raises(ValueError):
            ri.Idem(r, prefix=ns, **bad)
    with pytest.raises(TypeError):
        ri.Idem(r, prefix=ns, wait_ms=100)  # seconds everywhere: `wait=0.1`
    with pytest.raises(ValueError):
        ri.IdemCommands(r, prefix=ns).claim("k", 0.5)
    s = ri.Settings()
    assert (s.lease, s.wait, s.beat_every, s.done_retries, s.oversize, s.max_tries) == (30, 10.0, 10.0, 5,
                                                                                           "complete", None)


def _calls(r, command):  # type: ignore[no-untyped-def]
    stats = r.info("commandstats").get(f"cmdstat_{command.upper()}")
    return stats["calls"] if stats else 0


def test_claim_many_and_done_many_in_chunks_of_10000(r, ns, module):  # type: ignore[no-untyped-def]
    cmds = ri.IdemCommands(r, prefix=ns)
    keys = [f"n{i}" for i in range(10005)]
    before = _calls(r, "idem.mclaim") if module else 0
    claims = cmds.claim_many(keys, 30)
    assert [c.status for c in claims] == [Status.NEW] * len(keys)
    if module:
        assert _calls(r, "idem.mclaim") == before + 2
    dones = cmds.done_many([(k, c.token, b"r") for k, c in zip(keys, claims)])
    assert all(d.completed for d in dones)
    again = cmds.claim_many(keys[:3] + keys[-2:], 30)
    assert [c.status for c in again] == [Status.DONE] * 5 and again[0].result == b"r"
    stale = cmds.done_many([(keys[0], "0" * 32)])
    assert stale[0].already_done


def test_done_many_takes_items_with_and_without_a_result(r, ns):  # type: ignore[no-untyped-def]
    cmds = ri.IdemCommands(r, prefix=ns)
    a, b, c = cmds.claim_many(["a", "b", "c"], 30)
    assert all(d.completed for d in cmds.done_many([("a", a.token, b"1"), ("b", b.token), ("c", c.token, None)]))
    assert [x.result for x in cmds.claim_many(["a", "b", "c"], 30)] == [b"1", None, None]
    d, e = cmds.claim_many(["d", "e"], 30)
    assert cmds.release_many([("d", d.token), ("e", "0" * 32)]) == [True, False]


def test_batch_commands_as_sent(r, ns, module):  # type: ignore[no-untyped-def]
    cmds = ri.IdemCommands(r, prefix=ns)
    if not module:
        for call in (lambda: cmds.mclaim(["a"], 30), lambda: cmds.mdone([("a", "t")]),
                     lambda: cmds.mrelease([("a", "t")])):
            with pytest.raises(ri.ModuleRequiredError, match="needs the redis-idem module"):
                call()
        return
    r.set(ns + "str", "v")
    a, dup, wrong = cmds.mclaim(["a", "a", "str"], 30, payloads=[b"1", b"1", b"1"])
    assert a.status is Status.NEW and dup.status is Status.BUSY and isinstance(wrong, ri.WrongTypeError)
    b = cmds.mclaim(["b"], 30)[0]
    done = cmds.mdone([("a", a.token, b"ra"), ("b", "0" * 32, b"rb")])
    assert done[0].completed and isinstance(done[1], ri.StaleError)
    with pytest.raises(ValueError, match="every item with a result or none"):
        cmds.mdone([("a", a.token, b"ra"), ("b", b.token)])
    assert cmds.mrelease([("b", b.token), ("b", b.token)]) == [True, False]
    with pytest.raises(redis.ResponseError):
        cmds.mclaim([], 30)


def test_no_thread_per_message_one_heartbeat_thread_per_idem(r, ns, monkeypatch):  # type: ignore[no-untyped-def]
    started = []
    real_start = threading.Thread.start

    def counting_start(thread):  # type: ignore[no-untyped-def]
        started.append(thread.name)
        return real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    idem = ri.Idem(r, prefix=ns)
    for i in range(100):
        assert idem.process(f"short{i}", lambda job: i) == i
    assert len(started) <= 1, started  # the instance's one heartbeat thread, asleep: none per message
    # ... and it keeps a long job: a 1-second lease outlived three times over.
    assert idem.process("long", lambda job: time.sleep(3.2) or "kept", lease=1) == "kept"
    assert idem.stats.extends >= 5 and idem.stats.leases_lost == 0
    assert len(started) <= 1, started


async def test_no_task_per_message_one_heartbeat_task_per_async_idem(server, ns):  # type: ignore[no-untyped-def]
    import asyncio

    import redis.asyncio

    loop = asyncio.get_running_loop()
    created = []
    default = loop.get_task_factory()

    def counting(loop, coro, **kwargs):  # type: ignore[no-untyped-def]
        code = getattr(coro, "cr_code", None)
        if code is not None and "redis_idem" in code.co_filename:  # redis-py's own tasks are its business
            created.append(coro.__qualname__)
        return default(loop, coro, **kwargs) if default else asyncio.Task(coro, loop=loop, **kwargs)

    client = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
    try:
        idem = ri.AsyncIdem(client, prefix=ns)
        loop.set_task_factory(counting)
        for i in range(100):
            assert await idem.process(f"short{i}", lambda job: i) == i
        assert len(created) <= 1, created
        assert await idem.process("long", lambda job: asyncio.sleep(3.2), lease=1) is None
        assert idem.stats.extends >= 5 and idem.stats.leases_lost == 0
        assert len(created) <= 1, created
    finally:
        loop.set_task_factory(default)
        await client.aclose()
