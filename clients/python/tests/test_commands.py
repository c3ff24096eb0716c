"""Every command's replies and errors, typed, on the session's edition."""

from __future__ import annotations

import threading
import time

import pytest
import redis

import redis_idem as ri
from redis_idem import Edition, RecordState, Status
from servers import FUNCTIONS, Server


@pytest.fixture
def cmds(r, ns):  # type: ignore[no-untyped-def]
    return ri.IdemCommands(r, prefix=ns)


def test_edition_is_asked_of_the_server(cmds, edition):  # type: ignore[no-untyped-def]
    assert cmds.edition is Edition(edition)
    assert ri.idem(cmds.client).edition is Edition(edition)


def test_a_server_with_neither_edition_is_refused_with_what_to_do():  # type: ignore[no-untyped-def]
    bare = Server(None)
    try:
        with pytest.raises(ri.NotInstalledError, match="FUNCTION LOAD"):
            ri.IdemCommands(bare.client()).claim("k", 10)
    finally:
        bare.stop()


def test_module_is_chosen_where_both_editions_are_loaded(edition):  # type: ignore[no-untyped-def]
    if edition != "module":
        pytest.skip("needs the module: the session runs the Functions edition")
    both = Server("module")
    try:
        both.client().execute_command("FUNCTION", "LOAD", "REPLACE", FUNCTIONS.read_text())
        assert ri.IdemCommands(both.client()).edition is Edition.MODULE
    finally:
        both.stop()


def test_claim_statuses_new_busy_done_retry(cmds):  # type: ignore[no-untyped-def]
    first = cmds.claim("a", 30)
    assert first.status is Status.NEW and first.claimed and first.attempt == 1
    assert len(first.token) == 32
    busy = cmds.claim("a", 30)
    assert busy.status is Status.BUSY and not busy.claimed and 0 < busy.lease_left <= 30 and busy.token is None
    assert cmds.done("a", first.token, result=b"charged").completed
    done = cmds.claim("a", 30)
    assert done.status is Status.DONE and done.result == b"charged" and done.attempt == 1

    held = cmds.claim("b", 30)
    assert cmds.release("b", held.token) is True
    assert cmds.release("b", held.token) is False
    retry = cmds.claim("b", 30)
    assert retry.status is Status.RETRY and retry.attempt == 2 and retry.token != held.token


def test_claim_mismatch_and_exhausted(cmds):  # type: ignore[no-untyped-def]
    c = cmds.claim("p", 30, payload=b"one", max_tries=1)
    assert cmds.claim("p", 30, payload=b"two").status is Status.MISMATCH
    cmds.release("p", c.token)
    ex = cmds.claim("p", 30, payload=b"one", max_tries=1)
    assert ex.status is Status.EXHAUSTED and ex.attempt == 1 and ex.value is None


def test_done_replies_already_stale_and_empty_result(cmds):  # type: ignore[no-untyped-def]
    c = cmds.claim("d", 30)
    reply = cmds.done("d", c.token, result=b"")
    assert (reply.code, reply.completed, reply.result_stored, reply.bloom_added) == (1, True, True, True)
    again = cmds.done("d", c.token)
    assert again.code == 0 and again.already_done and not again.completed and not again
    assert cmds.claim("d", 30).result == b""

    old = cmds.claim("s", 1)
    time.sleep(1.1)
    cmds.claim("s", 30)  # RETRY: someone else holds it now
    with pytest.raises(ri.StaleError, match="^STALE"):
        cmds.done("s", old.token)
    with pytest.raises(redis.ResponseError):  # still a redis-py ResponseError
        cmds.extend("s", old.token, 10)


def test_extend_and_stale_extend(cmds):  # type: ignore[no-untyped-def]
    c = cmds.claim("e", 2)
    assert cmds.extend("e", c.token, 60) is True
    assert cmds.get("e").lease_ms > 50000
    with pytest.raises(ri.StaleError, match="does not hold the claim"):
        cmds.extend("e", "0" * 32, 10)
    with pytest.raises(ri.StaleError):
        cmds.extend("missing", "0" * 32, 10)


def test_invalid_token_and_too_large_result(cmds, r, module):  # type: ignore[no-untyped-def]
    c = cmds.claim("i", 30)
    with pytest.raises(ri.InvalidTokenError):
        cmds.done("i", "x" * 40)
    big = b"x" * (1048576 + 1)
    with pytest.raises(ri.ResultTooLargeError, match="idem.max-result"):
        cmds.done("i", c.token, result=big)
    assert cmds.get("i").state is RecordState.PROCESSING  # nothing changed


@pytest.mark.parametrize("protocol", [2, 3])
def test_get_record_in_resp2_and_resp3(server, ns, protocol, module):  # type: ignore[no-untyped-def]
    cmds = ri.IdemCommands(server.client(protocol=protocol), prefix=ns)
    assert cmds.get("g") is None
    c = cmds.claim("g", 30, payload=b"body")
    rec = cmds.get("g")
    assert rec.state is RecordState.PROCESSING and rec.attempt == 1 and 0 < rec.lease_ms <= 30000
    assert rec.claimed_at > 1_600_000_000_000 and rec.done_at == 0 and rec.result is None
    assert len(rec.fingerprint) == 32 and rec.pttl > rec.lease_ms
    cmds.done("g", c.token, result=b"r", retain=100)
    rec = cmds.get("g")
    assert rec.state is RecordState.DONE and rec.result == b"r" and rec.done_at >= rec.claimed_at
    assert 0 < rec.pttl <= 100000 and rec.lease_ms == 0


def test_expired_and_released_states(cmds):  # type: ignore[no-untyped-def]
    c = cmds.claim("x", 1)
    z = cmds.claim("z", 30)
    cmds.release("z", z.token)
    assert cmds.get("z").state is RecordState.RELEASED
    time.sleep(1.05)
    assert cmds.get("x").state is RecordState.EXPIRED and c.attempt == 1


def test_once(cmds):  # type: ignore[no-untyped-def]
    assert cmds.once("o", 100) is True
    assert cmds.once("o", 100) is False
    rec = cmds.get("o")
    assert rec.state is RecordState.DONE and rec.attempt == 0 and rec.claimed_at == 0


def test_wrongtype_is_passed_through_typed(cmds, r, ns):  # type: ignore[no-untyped-def]
    r.set(ns + "str", "v")
    for call in (lambda: cmds.claim("str", 10), lambda: cmds.get("str"), lambda: cmds.once("str", 10)):
        with pytest.raises(ri.WrongTypeError, match="^WRONGTYPE"):
            call()


def test_prefix_namespaces_every_key(r, ns):  # type: ignore[no-untyped-def]
    a = ri.IdemCommands(r, prefix=ns + "tenant-a:")
    b = ri.IdemCommands(r, prefix=ns + "tenant-b:")
    ta = a.claim("order:1", 30)
    a.done("order:1", ta.token, result=b"a's")
    assert b.claim("order:1", 30).status is Status.NEW  # no cross-tenant replay
    assert r.exists(ns + "tenant-a:order:1") and r.exists(ns + "tenant-b:order:1")


def test_decode_responses_client(server, ns):  # type: ignore[no-untyped-def]
    cmds = ri.IdemCommands(server.client(decode_responses=True), prefix=ns)
    c = cmds.claim("s", 30)
    assert c.status is Status.NEW and isinstance(c.token, str)
    cmds.done("s", c.token, result="text")
    assert cmds.claim("s", 30).result == "text"
    assert cmds.get("s").state is RecordState.DONE


# The module's own options: WAIT, BLOOM, filters. On the Functions edition
# each is refused before anything is sent, with an error naming the module.


def test_wait_returns_the_holders_result(cmds, module):  # type: ignore[no-untyped-def]
    if not module:
        with pytest.raises(ri.ModuleRequiredError, match="WAIT needs the redis-idem module"):
            cmds.claim("w", 30, wait=0.1)
        return
    c = cmds.claim("w", 30)
    threading.Timer(0.2, lambda: cmds.done("w", c.token, result=b"first")).start()
    reply = cmds.claim("w", 30, wait=5)
    assert reply.status is Status.DONE and reply.result == b"first"
    busy = cmds.claim("v", 30)
    assert cmds.claim("v", 30, wait=0.05).status is Status.BUSY and busy.claimed


def test_bloom_seen_and_done_reply_bits(cmds, r, ns, module):  # type: ignore[no-untyped-def]
    if not module:
        with pytest.raises(ri.ModuleRequiredError, match="BLOOM needs the redis-idem module"):
            cmds.claim("k", 30, bloom="f")
        with pytest.raises(ri.ModuleRequiredError, match="BLOOM"):
            cmds.done("k", "0" * 32, bloom="f")
        return
    c = cmds.claim("k", 30, bloom="f")
    assert c.status is Status.NEW
    assert cmds.done("k", c.token, bloom="f").bloom_added
    r.delete(ns + "k")
    assert cmds.claim("k", 30, bloom="f").status is Status.SEEN
    # 5: the filter add is dropped (the filter key holds another type)
    r.set(ns + "notfilter", "x")
    c = cmds.claim("k2", 30)
    five = cmds.done("k2", c.token, result=b"r", bloom="notfilter")
    assert (five.code, five.completed, five.result_stored, five.bloom_added) == (5, True, True, False)


def test_done_over_maxmemory_drops_the_result_but_completes(cmds, r, module):  # type: ignore[no-untyped-def]
    if not module:
        pytest.skip("the Functions edition stores the RESULT even over maxmemory (docs/functions.md)")
    c = cmds.claim("m", 30)
    c7 = cmds.claim("m7", 30)
    r.set("notfilter7", "x")
    r.config_set("maxmemory", 1)
    try:
        three = cmds.done("m", c.token, result=b"r")
        seven = cmds.done("m7", c7.token, result=b"r", bloom="{notfilter7}")
    finally:
        r.config_set("maxmemory", 0)
    assert (three.code, three.completed, three.result_stored, three.bloom_added) == (3, True, False, True)
    assert seven.code in (3, 7) and seven.completed and not seven.result_stored
    assert cmds.get("m").state is RecordState.DONE and cmds.claim("m", 30).result is None


def test_filters(cmds, module):  # type: ignore[no-untyped-def]
    if not module:
        for call in (lambda: cmds.bf_add("f", "a"), lambda: cmds.bf_info("f"),
                     lambda: cmds.bf_reserve("f", 0.01, 100)):
            with pytest.raises(ri.ModuleRequiredError, match="needs the redis-idem module"):
                call()
        return
    assert cmds.bf_info("f") is None
    assert cmds.bf_reserve("f", 0.01, 1000, window=3, shard="HOUR", expansion=2) is True
    with pytest.raises(redis.ResponseError, match="already exists"):
        cmds.bf_reserve("f", 0.01, 1000)
    assert cmds.bf_add("f", "a") is True and cmds.bf_add("f", "a") is False
    assert cmds.bf_madd("f", "b", "a", "b") == [True, False, False]
    assert cmds.bf_exists("f", "a") is True and cmds.bf_exists("f", "zz") is False
    assert cmds.bf_mexists("f", "a", "zz") == [True, False]
    info = cmds.bf_info("f")
    assert (info.window, info.shard, info.expansion, info.items, info.capacity) == (3, 3600, 2, 2, 1000)
    assert abs(info.error_rate - 0.01) < 1e-12 and info.bytes > 0
    assert len(info.shards) == 1 and info.shards[0].items == 2 and info.shards[0].filters == 1
