"""Operator actions (redis_idem.Operator) and the `redis-idem` tool, on the
session's edition: a dead letter listed, shown and requeued, then completed
on its next delivery with a higher attempt; in a 3-node cluster, `ls` finds
the records of every primary."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from typing import List

import pytest
import redis
from redis.cluster import RedisCluster

import redis_idem as ri
from redis_idem import Status
from servers import Cluster


def dead_letter(cmds: ri.IdemCommands, key: str, tries: int) -> None:
    """`key` claimed and released `tries` times with MAXTRIES tries."""
    for attempt in range(1, tries + 1):
        reply = cmds.claim(key, 60, max_tries=tries)
        assert reply.attempt == attempt
        assert cmds.release(key, reply.value)
    assert cmds.claim(key, 60, max_tries=tries).status is Status.EXHAUSTED


def tool(url: str, *args: str, cluster: bool = False, stdin: str = "") -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "redis_idem.cli", "-u", url, *(["--cluster"] if cluster else []), *args]
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60)


def test_the_console_script_is_installed():  # type: ignore[no-untyped-def]
    # pip puts it beside the interpreter of the venv it installs into.
    from pathlib import Path

    script = Path(sys.executable).parent / "redis-idem"
    assert script.exists(), f"{script}: pip install ./clients/python installs the redis-idem command"
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "requeue" in out.stdout, out.stderr


def test_scan_filters_and_requeue(r, ns):  # type: ignore[no-untyped-def]
    cmds, op = ri.IdemCommands(r), ri.Operator(r)
    dead_letter(cmds, ns + "dead", 2)
    live = cmds.claim(ns + "live", 600)
    done = cmds.claim(ns + "done", 600)
    cmds.done(ns + "done", done.value, result=b"r")
    r.set(ns + "plain", "x")

    def keys(**filters) -> List[bytes]:  # type: ignore[no-untyped-def]
        return sorted(set(op.scan(match=ns + "*", count=5, **filters)))

    assert keys() == sorted(k.encode() for k in (ns + "dead", ns + "live", ns + "done"))
    assert keys(state="released", min_tries=2) == [(ns + "dead").encode()]
    assert keys(state="processing") == [(ns + "live").encode()]
    assert keys(idle=3600) == []
    assert keys(state="done") == [(ns + "done").encode()]

    assert op.requeue(ns + "dead") is True
    assert cmds.get(ns + "dead").tries == 0
    assert op.requeue(ns + "absent") is False
    with pytest.raises(ri.LiveLeaseError, match="live lease"):
        op.requeue(ns + "live")
    assert cmds.get(ns + "live").state is ri.RecordState.PROCESSING
    assert live.attempt == 1


async def test_the_asyncio_operator(server, r, ns):  # type: ignore[no-untyped-def]
    import redis.asyncio as aioredis

    dead_letter(ri.IdemCommands(r), ns + "dead", 2)
    client = aioredis.Redis(host="127.0.0.1", port=server.port)
    try:
        op = ri.AsyncOperator(client)
        found = [key async for key in op.scan(state="released", min_tries=2, match=ns + "*")]
        assert found == [(ns + "dead").encode()]
        assert await op.requeue(ns + "dead") is True
        assert await op.requeue(ns + "absent") is False
    finally:
        await client.aclose()
    assert ri.IdemCommands(r).get(ns + "dead").tries == 0


def test_a_dead_letter_through_the_tool(server, r, ns):  # type: ignore[no-untyped-def]
    cmds = ri.IdemCommands(r)
    key = ns + "order:1001"
    dead_letter(cmds, key, 3)

    listed = tool(server.url, "ls", "--state", "released", "--min-tries", "3", "--match", ns + "*", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(row["key"], row["attempt"], row["tries"]) for row in rows] == [(key, 3, 3)]
    table = tool(server.url, "ls", "--match", ns + "*")
    assert key in table.stdout and "released" in table.stdout

    shown = tool(server.url, "show", key)
    assert shown.returncode == 0, shown.stderr
    assert "released" in shown.stdout and "attempt      3" in shown.stdout and "ago)" in shown.stdout
    assert tool(server.url, "show", ns + "absent").returncode == 1

    # Selected by filters: asks first, and a "no" changes nothing.
    refused = tool(server.url, "requeue", "--state", "released", "--match", ns + "*", stdin="n\n")
    assert refused.returncode == 1 and "1 records match" in refused.stderr
    assert cmds.get(key).tries == 3
    requeued = tool(server.url, "requeue", "--state", "released", "--match", ns + "*", "--yes")
    assert requeued.returncode == 0, requeued.stderr
    assert "1 requeued" in requeued.stdout
    assert cmds.get(key).tries == 0

    # Its next delivery: three more tries, the fence higher than any before.
    reply = cmds.claim(key, 60, max_tries=3)
    assert (reply.status, reply.attempt) == (Status.RETRY, 4)
    assert cmds.done(key, reply.value)
    assert cmds.get(key).state is ri.RecordState.DONE

    by_key = tool(server.url, "requeue", key, ns + "absent")
    assert by_key.returncode == 0, by_key.stderr
    assert f"{key}: requeued" in by_key.stdout and f"{ns}absent: absent" in by_key.stdout


def test_stats_once(server, r, ns):  # type: ignore[no-untyped-def]
    dead_letter(ri.IdemCommands(r), ns + "dead", 3)
    out = tool(server.url, "stats", "--once", "--interval", "0.2", "--json")
    assert out.returncode == 0, out.stderr
    sample = json.loads(out.stdout)
    assert sample["dead_letters"] >= 1
    assert "stuck" in sample and isinstance(sample["rates_per_second"], dict)


@pytest.fixture(scope="module")
def cluster(edition):  # type: ignore[no-untyped-def]
    c = Cluster(edition)
    yield c
    c.stop()


async def async_scan(port: int, ns: str) -> List[bytes]:
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    client = AsyncRedisCluster(host="127.0.0.1", port=port)
    try:
        return sorted({key async for key in ri.AsyncOperator(client).scan(match=ns + "*")})
    finally:
        await client.aclose()


def test_ls_finds_every_primarys_records(cluster, ns):  # type: ignore[no-untyped-def]
    rc = RedisCluster(host="127.0.0.1", port=cluster.port)
    try:
        cmds = ri.IdemCommands(rc)
        keys = [f"{ns}{i}" for i in range(30)]
        for key in keys:
            cmds.claim(key, 600)
        nodes = {rc.get_node_from_key(key).port for key in keys}
        assert len(nodes) == 3, "the keys span every primary"
        assert sorted(set(ri.Operator(rc).scan(match=ns + "*"))) == sorted(k.encode() for k in keys)
        url = f"redis://127.0.0.1:{cluster.port}"
        listed = tool(url, "ls", "--match", ns + "*", "--json", cluster=True)
        assert listed.returncode == 0, listed.stderr
        assert sorted(row["key"] for row in json.loads(listed.stdout)) == sorted(keys)
        assert asyncio.run(async_scan(cluster.port, ns)) == sorted(k.encode() for k in keys)
        # Routed to the key's node.
        assert cmds.once(ns + "marked", 60)
        assert ri.Operator(rc).requeue(ns + "marked") is True
    finally:
        rc.close()


HOSTILE = [b"\x1b[2J\x1b]0;owned\x07", b"bel\x07", b"cr\rx", b"nul\x00x", b"line\nforged  released  9  9",
           b"\xff\xfe", "caf\u00e9".encode(), b'q"uote', b"\xe2\x80\xaeevil", b"sp ace"]


def first_column(line: str) -> str:
    if not line.startswith('"'):
        return line.split("  ")[0]
    i = 1
    while line[i] != '"':
        i += 2 if line[i] == "\\" else 1
    return line[: i + 1]


def test_ls_and_show_escape_every_hostile_key_and_take_the_quoted_form_back(server, r, ns):  # type: ignore[no-untyped-def]
    cmds = ri.IdemCommands(r)
    keys = [ns.encode() + name for name in HOSTILE]
    for key in keys:
        assert cmds.claim(key, 600).status is Status.NEW
    listed = subprocess.run([sys.executable, "-m", "redis_idem.cli", "-u", server.url, "ls", "--match", ns + "*"],
                            capture_output=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    out = listed.stdout
    for byte in (b"\x1b", b"\x07", b"\r", b"\x00", b"\xff", b"\xe2\x80\xae"):
        assert byte not in out, (byte, out)
    lines = out.decode().splitlines()
    assert len(lines) == 1 + len(keys), lines  # a newline in a key forges no row
    shown = [first_column(line) for line in lines[1:]]
    assert f"{ns}caf\u00e9" in shown  # printable UTF-8 stays readable
    from redis_idem._quote import quote, unquote

    assert sorted(unquote(s) for s in shown) == sorted(keys)
    for key in keys:
        form = quote(key)
        assert form in shown, (form, shown)
        one = subprocess.run([sys.executable, "-m", "redis_idem.cli", "-u", server.url, "show", form],
                             capture_output=True, timeout=60)
        assert one.returncode == 0 and b"processing" in one.stdout and b"Traceback" not in one.stderr, one
        assert b"\x1b" not in one.stdout and b"\x00" not in one.stdout
    # The raw bytes, as a shell passes them, work too.
    raw = subprocess.run([sys.executable, "-m", "redis_idem.cli", "-u", server.url, "show", keys[5]],
                         capture_output=True, timeout=60)
    assert raw.returncode == 0 and b"processing" in raw.stdout, raw
    # requeue of a quoted key: refused while its lease is live, by name, without a traceback.
    refused = subprocess.run([sys.executable, "-m", "redis_idem.cli", "-u", server.url, "requeue", quote(keys[0])],
                             capture_output=True, timeout=60)
    assert refused.returncode == 1 and b"Traceback" not in refused.stderr and b"\x1b" not in refused.stderr
    reply = cmds.claim(ns.encode() + b"\xff\x00", 60)
    cmds.release(ns.encode() + b"\xff\x00", reply.token)
    requeued = subprocess.run([sys.executable, "-m", "redis_idem.cli", "-u", server.url, "requeue",
                               quote(ns.encode() + b"\xff\x00")], capture_output=True, timeout=60)
    assert requeued.returncode == 0 and b"requeued" in requeued.stdout, requeued
    assert cmds.get(ns.encode() + b"\xff\x00").tries == 0


def test_ls_and_show_print_the_owner(server, r, ns):  # type: ignore[no-untyped-def]
    cmds = ri.IdemCommands(r)
    cmds.claim(ns + "held", 600, owner="worker-7:\x1b[31m")
    listed = tool(server.url, "ls", "--match", ns + "*")
    assert listed.returncode == 0, listed.stderr
    assert "owner" in listed.stdout.splitlines()[0] and '"worker-7:\\x1b[31m"' in listed.stdout, listed.stdout
    shown = tool(server.url, "show", ns + "held")
    assert 'owner        "worker-7:\\x1b[31m"' in shown.stdout, shown.stdout


def _scan_calls(r, module):  # type: ignore[no-untyped-def]
    """Keyspace walk steps: IDEM.SCAN shows as itself or as the SCAN it runs; idem_scan as the SCAN it calls."""
    stats = {name.lower(): value for name, value in r.info("commandstats").items()}
    names = ("cmdstat_idem.scan", "cmdstat_scan") if module else ("cmdstat_scan",)
    return max(stats.get(name, {}).get("calls", 0) for name in names)


def test_stats_samples_read_counters_and_walk_only_at_its_interval(server, r, ns, module):  # type: ignore[no-untyped-def]
    dead_letter(ri.IdemCommands(r), ns + "dead", 3)
    before = _scan_calls(r, module)
    assert tool(server.url, "stats", "--once", "--interval", "0.1").returncode == 0
    one_walk = _scan_calls(r, module) - before  # the session's keyspace, walked three times
    assert one_walk >= 3
    argv = [sys.executable, "-m", "redis_idem.cli", "-u", server.url, "stats", "--interval", "0.1"]
    for extra in (["--no-walk"], []):
        before = _scan_calls(r, module)
        proc = subprocess.Popen(argv + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        watchdog = threading.Timer(120, proc.terminate)
        watchdog.start()
        lines = []
        while sum("INFO idem, per second" in line for line in lines) < 10:  # ten samples
            line = proc.stdout.readline()
            assert line, ("stats ended", lines, proc.stderr.read())
            lines.append(line)
        watchdog.cancel()
        proc.terminate()
        out = "".join(lines) + proc.communicate(timeout=10)[0]
        walked = _scan_calls(r, module) - before
        if extra:
            assert walked == 0, walked  # counters only: no keyspace walk at all
        else:
            # One walk at start, none per sample (the keyspace is the same: as many calls as --once made).
            assert walked <= one_walk + 3, (walked, one_walk)
            assert out.count("dead letters") == 1 and "ms of server time" in out, out
