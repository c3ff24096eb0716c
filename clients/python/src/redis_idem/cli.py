"""`redis-idem`: the operator's tool, for either edition, a server or a
cluster.

    redis-idem -u redis://host:6379 ls --state released --min-tries 3
    redis-idem show order:1001
    redis-idem requeue order:1001 order:1002
    redis-idem requeue --state released --min-tries 3     # asks first; --yes skips
    redis-idem stats --max-tries 3                        # --once: one sample

`-u` takes a URL as redis-cli does (default redis://127.0.0.1:6379);
`--cluster` scans every primary of a cluster. Key names are shown as
redis-cli shows them: one that holds a control character, a quote, a
space or bytes that are not UTF-8 is printed in double quotes with
redis-cli's escapes (`"order\x1b[2J"`), and `show` and `requeue` take that
form back."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence

import redis

from ._operator import Operator
from ._quote import printable, quote, unquote

#: A scan running longer than this shows its progress on stderr.
PROGRESS_AFTER_S = 1.0


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="backslashreplace")
    return str(value)


def _connect(args: argparse.Namespace) -> Operator:
    if args.cluster:
        from redis.cluster import RedisCluster

        client: Any = RedisCluster.from_url(args.url)
    else:
        client = redis.Redis.from_url(args.url)
    return Operator(client)


def _age(ms: int, now_ms: int) -> str:
    seconds = max(0, now_ms - ms) // 1000
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    if minutes:
        return f"{minutes}m{seconds}s"
    return f"{seconds}s"


def _date(ms: int) -> str:
    when = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _now_ms() -> int:
    return int(time.time() * 1000)


class _ProgressLine:
    """A line on stderr, rewritten in place, once a scan runs long."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.shown = False

    def __call__(self, node: int, nodes: int, calls: int, found: int) -> None:
        if time.monotonic() - self.started < PROGRESS_AFTER_S:
            return
        where = f"node {node + 1}/{nodes}, " if nodes > 1 else ""
        sys.stderr.write(f"\rscanning: {where}{calls} calls, {found} matching on this node   ")
        sys.stderr.flush()
        self.shown = True

    def end(self) -> None:
        if self.shown:
            sys.stderr.write("\n")


def _filters(args: argparse.Namespace) -> Dict[str, Any]:
    return {"state": args.state, "min_tries": args.min_tries, "idle": args.idle, "match": args.match,
            "count": args.count}


def _selected(op: Operator, args: argparse.Namespace) -> List[bytes]:
    progress = _ProgressLine()
    try:
        # A record may come twice (SCAN's guarantee); list it once.
        return list(dict.fromkeys(op.scan(progress=progress, **_filters(args))))
    finally:
        progress.end()


def _name(value: Any) -> str:
    """A key (or an owner: both are whatever a client sent) as redis-cli shows it."""
    return quote(value if isinstance(value, bytes) else str(value).encode())


def _owner(fields: Dict[str, Any]) -> str:
    owner = fields.get("owner")
    return "-" if owner is None else _name(owner)


def _row(key: bytes, fields: Dict[str, Any], now: int) -> Dict[str, Any]:
    # Since the latest claim, or the completion of a done record.
    changed = fields["done_at"] if fields["state"] == "done" else fields["claimed_at"]
    return {"key": _name(key), "state": fields["state"], "attempt": fields["attempt"],
            "tries": fields.get("tries", fields["attempt"]), "owner": _owner(fields),
            "claimed_at": fields["claimed_at"], "done_at": fields["done_at"], "lease_ms": fields["lease_ms"],
            "pttl": fields["pttl"], "age": _age(changed, now) if changed else "-"}


def cmd_ls(op: Operator, args: argparse.Namespace) -> int:
    keys = _selected(op, args)
    now = _now_ms()
    rows = []
    for key in keys:
        fields = op.get(key)
        if fields is not None:  # gone since the scan
            rows.append(_row(key, fields, now))
    if args.json:
        json.dump(rows, sys.stdout)
        sys.stdout.write("\n")
        return 0
    columns = ["key", "state", "attempt", "tries", "owner", "age", "lease_ms", "pttl"]
    table = [columns] + [[str(row[c]) for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
    print(f"({len(rows)} records)", file=sys.stderr)
    return 0


def cmd_show(op: Operator, args: argparse.Namespace) -> int:
    key = unquote(args.key)
    fields = op.get(key)
    if fields is None:
        print(f"{_name(key)}: no record", file=sys.stderr)
        return 1
    if args.json:
        shown = {k: _text(v) if isinstance(v, bytes) else v for k, v in fields.items()}
        shown["owner"] = None if fields.get("owner") is None else _owner(fields)
        json.dump({"key": _name(key), **shown}, sys.stdout)
        sys.stdout.write("\n")
        return 0
    now = _now_ms()
    print(f"key          {_name(key)}")
    for name in ["state", "attempt", "tries"]:
        if name in fields:
            print(f"{name:<12} {fields[name]}")
    print(f"{'owner':<12} {_owner(fields)}")
    for name in ["claimed_at", "done_at"]:
        ms = fields[name]
        print(f"{name:<12} {_date(ms)} ({_age(ms, now)} ago)" if ms else f"{name:<12} -")
    lease, pttl = fields["lease_ms"], fields["pttl"]
    print(f"{'lease left':<12} {lease / 1000:.1f}s" if lease else f"{'lease left':<12} -")
    print(f"{'expires':<12} {_date(now + pttl)} (in {pttl / 1000:.1f}s)" if pttl >= 0 else f"{'expires':<12} never")
    result = fields.get("result")
    print(f"{'result':<12} {'-' if result is None else _name(result)}")
    print(f"{'fingerprint':<12} {fields.get('fingerprint') or '-'}")
    return 0


def cmd_requeue(op: Operator, args: argparse.Namespace) -> int:
    has_filter = any(v is not None for v in (args.state, args.min_tries, args.idle, args.match))
    if args.keys and has_filter:
        print("requeue: give keys or filters, not both", file=sys.stderr)
        return 2
    if not args.keys and not has_filter:
        print("requeue: give the keys, or filters (--state, --min-tries, --idle, --match) to select them",
              file=sys.stderr)
        return 2
    keys: Sequence[Any] = [unquote(k) for k in args.keys] or _selected(op, args)
    if not args.keys:
        print(f"{len(keys)} records match.", file=sys.stderr)
        if not keys:
            return 0
        if not args.yes:
            sys.stderr.write(f"Requeue {len(keys)} records? [y/N] ")
            sys.stderr.flush()
            if sys.stdin.readline().strip().lower() not in ("y", "yes"):
                print("nothing requeued", file=sys.stderr)
                return 1
    counts = {"requeued": 0, "absent": 0, "refused": 0}
    for key in keys:
        try:
            outcome = "requeued" if op.requeue(key) else "absent"
        except redis.ResponseError as e:
            outcome = "refused"
            print(f"{_name(key)}: {printable(str(e))}", file=sys.stderr)
        counts[outcome] += 1
        if args.keys:
            print(f"{_name(key)}: {outcome}")
    print(", ".join(f"{n} {what}" for what, n in counts.items()))
    return 0 if counts["refused"] == 0 else 1


class _Walk:
    """The dead-letter and stuck counts: three IDEM.SCAN walks of the
    keyspace (STATE expired / released MINTRIES n, STATE expired IDLE s),
    which cost the server's main thread time in proportion to every key it
    holds, so `stats` makes them only at a long interval (or once, on
    demand) and prints what they cost: calls and the server's time (INFO
    commandstats), besides the wall time."""

    def __init__(self, op: Operator, max_tries: int, stuck_after: int):
        self.op, self.max_tries, self.stuck_after = op, max_tries, stuck_after

    def _server_usec(self) -> int:
        # The module's walk shows as IDEM.SCAN and as the server's SCAN it
        # runs (Redis 7.0 lists only the latter); the Functions edition's as FCALL_RO.
        names = ("cmdstat_idem.scan", "cmdstat_scan") if self.op.module else ("cmdstat_fcall_ro",)
        total = 0
        for node in self.op.primaries():
            stats = {name.lower(): value for name, value in node.info("commandstats").items()}
            total += sum(int(stats.get(name, {}).get("usec", 0)) for name in names)
        return total

    def __call__(self) -> Dict[str, Any]:
        calls = [0]

        def count(node: int, nodes: int, n: int, found: int) -> None:
            calls[0] += 1

        usec, started = self._server_usec(), time.monotonic()
        dead = set()
        for state in ("expired", "released"):
            dead.update(self.op.scan(state=state, min_tries=self.max_tries, count=1000, progress=count))
        stuck = set(self.op.scan(state="expired", idle=self.stuck_after, count=1000, progress=count)) - dead
        cost = {"calls": calls[0], "seconds": round(time.monotonic() - started, 3),
                "server_ms": round((self._server_usec() - usec) / 1000, 1)}
        return {"dead_letters": len(dead), "stuck": len(stuck), "walked_at": _date(_now_ms()), "cost": cost}


def _rates(before: Dict[str, int], after: Dict[str, int], seconds: float) -> Dict[str, float]:
    return {name: (after[name] - before.get(name, 0)) / seconds for name in sorted(after)}


def cmd_stats(op: Operator, args: argparse.Namespace) -> int:
    """Every `interval`: INFO idem as rates (a few counters; no keyspace
    walk). The dead letters and stuck work: a walk at start and every
    `walk_every` seconds (0: at start only; --no-walk: never)."""
    walk = _Walk(op, args.max_tries, args.stuck_after)
    counts: Optional[Dict[str, Any]] = None if args.no_walk else walk()
    walked, shown = time.monotonic(), False
    before, started = op.counters(), time.monotonic()
    while True:
        time.sleep(args.interval)
        after, now = op.counters(), time.monotonic()
        fresh = False
        if not args.no_walk and args.walk_every and now - walked >= args.walk_every:
            counts, walked, fresh = walk(), time.monotonic(), True
        rates = _rates(before, after, now - started)
        if args.json:
            json.dump({"rates_per_second": rates, **(counts or {})}, sys.stdout)
            sys.stdout.write("\n")
        else:
            print(f"{_date(_now_ms())}  INFO idem, per second:")
            busy = [(name, rate) for name, rate in rates.items() if rate]
            for name, rate in busy or [("(no traffic)", 0.0)]:
                print(f"  {name:<24} {rate:10.1f}/s")
            if not op.module:
                print("  (the Functions edition keeps no INFO idem counters)")
            if counts is not None and (fresh or not shown):
                cost = counts["cost"]
                print(f"  dead letters (tries >= {args.max_tries}): {counts['dead_letters']}  stuck (expired, idle >= "
                      f"{args.stuck_after}s): {counts['stuck']}  [walk at {counts['walked_at']}: {cost['calls']} "
                      f"IDEM.SCAN calls, {cost['server_ms']} ms of server time, {cost['seconds']} s]")
                shown = True
        sys.stdout.flush()
        if args.once:
            return 0
        before, started = after, now


def _add_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state", choices=["processing", "expired", "released", "done"])
    parser.add_argument("--min-tries", type=int, metavar="N", help="claims since the latest requeue >= N")
    parser.add_argument("--idle", type=int, metavar="SECONDS", help="latest change at least this old")
    parser.add_argument("--match", metavar="PATTERN", help="a SCAN glob on the key name")
    parser.add_argument("--count", type=int, default=100, help="SCAN COUNT: work per call (default 100)")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="redis-idem", description="Operate redis-idem records: list, show, requeue, "
                                  "watch (the module or the Functions edition).")
    top.add_argument("-u", "--url", default="redis://127.0.0.1:6379", help="server URL, as redis-cli -u takes it")
    top.add_argument("--cluster", action="store_true", help="a Redis Cluster: scan every primary")
    sub = top.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("ls", help="list the records the filters select")
    _add_filters(ls)
    ls.add_argument("--json", action="store_true", help="one JSON array instead of a table")
    show = sub.add_parser("show", help="one record, with times as dates and ages")
    show.add_argument("key")
    show.add_argument("--json", action="store_true")
    requeue = sub.add_parser("requeue", help="give records' work back (attempt kept, tries restarted)")
    requeue.add_argument("keys", nargs="*")
    _add_filters(requeue)
    requeue.add_argument("--yes", action="store_true", help="do not ask before requeueing what filters select")
    stats = sub.add_parser("stats", help="INFO idem as rates per second; the dead letters and stuck work from a "
                           "walk of the keyspace at start and every --walk-every seconds")
    stats.add_argument("--once", action="store_true", help="one sample (and one walk), then exit")
    stats.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    stats.add_argument("--walk-every", type=float, default=600.0, metavar="SECONDS",
                       help="seconds between walks for the dead-letter and stuck counts (default 600; 0: at start only)")
    stats.add_argument("--no-walk", action="store_true", help="never walk the keyspace: counters only")
    stats.add_argument("--max-tries", type=int, default=3, help="your consumers' MAXTRIES (default 3)")
    stats.add_argument("--stuck-after", type=int, default=60, help="an expired record idle this long is stuck")
    stats.add_argument("--json", action="store_true")
    return top


COMMANDS = {"ls": cmd_ls, "show": cmd_show, "requeue": cmd_requeue, "stats": cmd_stats}


def main(argv: Optional[Iterable[str]] = None) -> int:
    args = parser().parse_args(None if argv is None else list(argv))
    try:
        return COMMANDS[args.command](_connect(args), args)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # an operator's tool answers in a line, never a traceback
        print(f"redis-idem: {printable(str(e))}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
