"""The consumer loop, sync: process(), the job context manager, the
decorator and process_many, against the session's edition."""

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


def test_first_run_then_replays_without_running_again(idem):  # type: ignore[no-untyped-def]
    runs, replays, calls = [], [], []
    idem.hooks = ri.Hooks(on_run=lambda job: runs.append(job.attempt), on_replay=lambda job: replays.append(job.key))

    def charge(job):  # type: ignore[no-untyped-def]
        calls.append(job.attempt)
        return {"charged": 1250, "attempt": job.attempt}

    assert idem.process("order:1", charge) == {"charged": 1250, "attempt": 1}
    assert idem.process("order:1", charge) == {"charged": 1250, "attempt": 1}  # deserialised replay
    assert calls == [1] and runs == [1] and replays == ["order:1"]
    s = idem.stats
    assert (s["runs"], s["replays"], s["completed"]) == (1, 1, 1)


def test_context_manager_tells_replay_and_completes_with_result(idem):  # type: ignore[no-untyped-def]
    with idem.job("cm") as job:
        assert not job.replayed and job.status is Status.NEW and job.attempt == 1
        job.result = [1, 2]
    assert job.done_reply.completed and job.result_stored
    with idem.job("cm") as again:
        assert again.replayed and again.result == [1, 2] and again.status is Status.DONE


def test_failure_releases_and_the_next_run_is_a_retry(idem):  # type: ignore[no-untyped-def]
    def fail(job):  # type: ignore[no-untyped-def]
        raise RuntimeError("provider down")

    with pytest.raises(RuntimeError, match="provider down"):
        idem.process("f", fail)
    assert idem.commands.get("f").state is RecordState.RELEASED
    seen = []
    assert idem.process("f", lambda job: seen.append((job.status, job.attempt)) or "ok") == "ok"
    assert seen == [(Status.RETRY, 2)] and idem.stats["released"] == 1 and idem.stats["retries"] == 1


def test_mismatch_and_exhausted_raise(idem):  # type: ignore[no-untyped-def]
    idem.process("m", lambda job: "a", payload=b"body-1")
    with pytest.raises(ri.MismatchError, match="another payload"):
        idem.process("m", lambda job: "b", payload=b"body-2")
    with pytest.raises(RuntimeError):
        idem.process("x", _raise, maxtries=1)
    with pytest.raises(ri.ExhaustedError) as e:
        idem.process("x", lambda job: "never", maxtries=1)
    assert e.value.attempt == 1 and idem.stats["exhausted"] == 1


def _raise(job):  # type: ignore[no-untyped-def]
    raise RuntimeError("failed")


def test_busy_waits_for_the_holder_and_replays_its_result(idem, r, module):  # type: ignore[no-untyped-def]
    started = threading.Event()

    def slow(job):  # type: ignore[no-untyped-def]
        started.set()
        time.sleep(0.6)
        return "first copy's"

    waits_done = r.info("idem")["idem_wait_done"] if module else 0
    holder = threading.Thread(target=lambda: idem.process("b", slow))
    holder.start()
    started.wait(5)
    t0 = time.monotonic()
    other = []
    assert idem.process("b", lambda job: other.append(1)) == "first copy's"
    holder.join()
    assert other == []
    if module:  # one CLAIM ... WAIT, blocked on the server and woken by the DONE
        assert idem.stats["busy"] == 0 and r.info("idem")["idem_wait_done"] == waits_done + 1
    else:  # polled: BUSY, backoff, until DONE
        assert idem.stats["busy"] >= 1
    assert time.monotonic() - t0 < 5


def test_busy_past_the_wait_raises_busy(idem):  # type: ignore[no-untyped-def]
    token = idem.commands.claim("held", 30).token
    with pytest.raises(ri.BusyError) as e:
        idem.process("held", lambda job: "x", wait=0.3)
    assert 0 < e.value.ms_left <= 30000 and token


@pytest.mark.parametrize("case", ["stale", "after-b"])
def test_lapsed_lease_second_worker_takes_over_first_done_refused(r, ns, case):  # type: ignore[no-untyped-def]
    # Worker A's heartbeat is as good as dead (a paused process): its 1 s
    # lease lapses, B takes over with attempt 2; A's DONE while B works is
    # refused (STALE), and so is one after B completed (already done).
    a = ri.Idem(r, prefix=ns + case, lease=1, heartbeat=3600)
    b = ri.Idem(r, prefix=ns + case, lease=5, wait=5)
    b_working, a_finished = threading.Event(), threading.Event()
    fences, errors = [], []

    def slow_a(job):  # type: ignore[no-untyped-def]
        fences.append(("a", job.attempt))
        b_working.wait(10)
        return "a"

    def run_a():  # type: ignore[no-untyped-def]
        try:
            a.process("lapse", slow_a)
        except ri.LeaseLostError as e:
            errors.append(e)
        a_finished.set()

    def work_b(job):  # type: ignore[no-untyped-def]
        fences.append(("b", job.attempt))
        if case == "stale":
            b_working.set()
            a_finished.wait(10)  # A's DONE comes while B holds the claim
        return "b"

    ta = threading.Thread(target=run_a)
    ta.start()
    deadline = time.monotonic() + 10
    while not fences and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b.process("lapse", work_b) == "b"
    b_working.set()
    ta.join()
    assert fences == [("a", 1), ("b", 2)]
    assert len(errors) == 1 and errors[0].attempt == 1 and a.stats["lost"] == 1, case
    assert b.process("lapse", lambda job: "again") == "b"


def test_heartbeat_keeps_a_job_past_its_lease(idem):  # type: ignore[no-untyped-def]
    other = ri.Idem(idem.client, prefix=idem.commands.prefix, wait=0)
    seen = []

    def work(job):  # type: ignore[no-untyped-def]
        for _ in range(6):  # 3 s under a 1 s lease
            time.sleep(0.5)
            with pytest.raises(ri.BusyError):
                other.process("hb", lambda j: "stolen")
            job.check()
        seen.append(job.attempt)
        return "kept"

    assert idem.process("hb", work, lease=1) == "kept"
    assert seen == [1] and idem.stats["extends"] >= 3 and idem.stats["lost"] == 0


@pytest.mark.long
def test_heartbeat_keeps_a_30_second_job_under_a_2_second_lease(idem):  # type: ignore[no-untyped-def]
    # Costs 30 s, so client.mk runs it on one server only (Redis 7.0, the
    # module): the heartbeat is the library's own thread sending EXTEND,
    # whose behaviour the servers share (tests/records.rs checks EXTEND on
    # every server); the short test above runs it on all of them.
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
    assert idem.stats["lost"] == 0 and idem.stats["extends"] >= 40


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


def test_oversize_result_completes_without_it(r, ns, module):  # type: ignore[no-untyped-def]
    size = 1048576 + 10
    if module:
        r.config_set("idem.max-result", 100)
        size = 200
    try:
        idem = ri.Idem(r, prefix=ns, serializer=ri.BytesSerializer())
        dropped = []
        idem.hooks.on_result_dropped = lambda job, n: dropped.append(n)
        assert idem.process("big", lambda job: b"x" * size) == b"x" * size
        assert dropped == [size] and idem.stats["results_dropped"] == 1
        rec = idem.commands.get("big")
        assert rec.state is RecordState.DONE and rec.result is None
        with idem.job("big") as job:  # the work is not re-opened
            assert job.replayed and job.result is None and not job.result_stored
        strict = ri.Idem(r, prefix=ns, serializer=ri.BytesSerializer(), on_oversize="raise")
        with pytest.raises(ri.ResultNotStoredError) as e:
            strict.process("big2", lambda job: b"y" * size)
        assert e.value.size == size and strict.commands.get("big2").state is RecordState.DONE
    finally:
        if module:
            r.config_set("idem.max-result", 1048576)


def test_decorator(idem):  # type: ignore[no-untyped-def]
    calls = []

    @idem.idempotent("charge:{0}", payload=lambda order, amount: f"{order}:{amount}")
    def charge(order, amount):  # type: ignore[no-untyped-def]
        calls.append(order)
        return amount * 2

    @idem.idempotent(lambda order: f"fenced:{order}", pass_job=True)
    def fenced(order, job):  # type: ignore[no-untyped-def]
        return job.attempt

    assert charge("o1", 5) == 10 and charge("o1", 5) == 10 and calls == ["o1"]
    with pytest.raises(ri.MismatchError):
        charge("o1", 6)
    assert fenced("o2") == 1 and fenced("o2") == 1


def test_process_many_claims_runs_and_completes_in_batches(idem, r, module):  # type: ignore[no-untyped-def]
    idem.process("k1", lambda job: "before")  # done already: replayed
    holder = idem.commands.claim("k2", 30)  # busy
    before = _calls(r, "idem.mclaim") if module else 0

    def work(job, item):  # type: ignore[no-untyped-def]
        if item == "boom":
            raise ValueError("bad item")
        return f"{item}@{job.attempt}"

    out = idem.process_many({"k1": "a", "k2": "b", "k3": "c", "k4": "boom"}, work)
    assert out["k1"] == "before" and isinstance(out["k2"], ri.BusyError)
    assert out["k3"] == "c@1" and isinstance(out["k4"], ValueError)
    assert idem.commands.get("k4").state is RecordState.RELEASED
    assert idem.process("k3", lambda job: "no") == "c@1"
    if module:
        assert _calls(r, "idem.mclaim") == before + 1
    assert holder.claimed


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
    stale = cmds.done_many([(keys[0], "0" * 32, None)])
    assert stale[0].already_done


def test_batch_commands_as_sent(r, ns, module):  # type: ignore[no-untyped-def]
    cmds = ri.IdemCommands(r, prefix=ns)
    if not module:
        with pytest.raises(ri.UnsupportedError, match="IDEM.MCLAIM needs the redis-idem module"):
            cmds.mclaim(30, ["a"])
        return
    r.set(ns + "str", "v")
    a, dup, wrong = cmds.mclaim(30, ["a", "a", "str"], payloads=[b"1", b"1", b"1"])
    assert a.status is Status.NEW and dup.status is Status.BUSY and isinstance(wrong, ri.WrongTypeError)
    b = cmds.mclaim(30, ["b"])[0]
    done = cmds.mdone([("a", a.token), ("b", "0" * 32)], results=[b"ra", b"rb"])
    assert done[0].completed and isinstance(done[1], ri.StaleError)
    assert cmds.mrelease([("b", b.token), ("b", b.token)]) == [True, False]
    with pytest.raises(redis.ResponseError):
        cmds.mclaim(30, [])
