"""make bench-clients-profile: where a library's time per message goes.

`make bench-clients` gives each library's wall time against the hand-made
pair; this says what that time is made of, for the targets it misses. For
each library, edition and side (the pair, process() with `batch` off and
on), it runs the library's program (bench/clients/README.md) with N and
then 2N messages. Per message: wall time, the program's CPU (getrusage of
it and its children; the difference of the two runs, so that the process's
start, build checks, JIT and warm-up cancel out), the server's CPU (INFO
CPU), the server's calls and their time (INFO commandstats) and the keys
each IDEM.MCLAIM / IDEM.MDONE carried. Medians over the rounds, into
bench/results/clients-profile.md.

On this 2-core machine the client and the server share two vCPUs: at 64 in
flight neither waits on the network, so the wall time per message cannot
fall below (client CPU + server CPU) / 2, nor below the larger of the two.
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from clients import HERE, LANGUAGES, server_cpu, start_servers

BATCHED = ("idem.mclaim", "idem.mdone")
IGNORED = ("info", "ping", "hello", "client", "select", "flushall")


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def commandstats(server):
    """{command: (calls, usec)} from INFO commandstats."""
    out = {}
    for name, stats in server.client.info("commandstats").items():
        out[name.removeprefix("cmdstat_").lower()] = (stats["calls"], stats["usec"])
    return out


def run(language, server, impl, scenario, inflight, messages, prefix, edition, batch):
    """One run: its totals (wall, client CPU, server CPU, commandstats)."""
    cmd = [str(HERE / "clients" / language / "run"), "--url", f"redis://127.0.0.1:{server.port}",
           "--impl", impl, "--scenario", scenario, "--inflight", str(inflight),
           "--messages", str(messages), "--prefix", prefix, "--edition", edition]
    if batch is not None:
        cmd += ["--batch", batch]
    stats_before, server_before, client_before = commandstats(server), server_cpu(server), children_cpu()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    client, server_used = children_cpu() - client_before, server_cpu(server) - server_before
    stats_after = commandstats(server)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    wall = json.loads(out.stdout.strip().splitlines()[-1])["seconds"]
    calls = {name: (c - stats_before.get(name, (0, 0))[0], u - stats_before.get(name, (0, 0))[1])
             for name, (c, u) in stats_after.items()}
    return {"wall": wall, "client": client, "server": server_used,
            "calls": {name: cu for name, cu in calls.items() if cu[0] and name not in IGNORED}}


def per_message(small, large, n):
    """The client's CPU per message of the n messages the large run (2n)
    had over the small one: its start, build check, JIT and warm-up cancel
    out. The rest from the large run alone (its 200 warm-up messages are 1%
    of the server's figures; the program times its wall itself): a batch's
    size varies from run to run, which a difference of two runs magnifies."""
    whole = 2 * n + 200
    return {"wall": large["wall"] / (2 * n), "client": (large["client"] - small["client"]) / n,
            "server": large["server"] / whole,
            "calls": {name: (c / whole, u / whole) for name, (c, u) in large["calls"].items()}}


def profile(language, server, edition, inflight, messages, rounds):
    """{(label, scenario): [per_message per round]}"""
    sides = [("hand-made pair", "pair", None), ("process(), batch off", "idem", "off"),
             ("process(), batch on", "idem", "on")]
    if inflight == 1:
        sides = sides[:2]
    figures = {}
    # Once untimed, so that a first run's build or cache warming is in no figure.
    run(language, server, "pair", "first", inflight, 200, f"p:{language}:warm:{time.time_ns()}:", edition, None)
    for r in range(rounds):
        for label, impl, batch in (sides if r % 2 == 0 else sides[::-1]):
            totals = {}
            for size in (messages, 2 * messages):
                prefix = f"p:{language}:{edition}:{inflight}:{impl}:{batch}:{r}:{size}:{time.time_ns()}:"
                for scenario in ("first", "replay"):
                    totals[(size, scenario)] = run(language, server, impl, scenario, inflight, size, prefix,
                                                   edition, batch)
            for scenario in ("first", "replay"):
                figures.setdefault((label, scenario), []).append(
                    per_message(totals[(messages, scenario)], totals[(2 * messages, scenario)], messages))
        server.client.flushall()
    return figures


def table(language, edition, inflight, figures):
    lines = [f"### {language}, {edition}, {inflight} in flight", "",
             "| side | scenario | wall µs/msg | client CPU µs/msg | server CPU µs/msg | (client + server) / 2 "
             "| keys per MCLAIM, MDONE | server commands per message: calls, µs |",
             "|---|---|---|---|---|---|---|---|"]
    for (label, scenario), runs in figures.items():
        med = {k: statistics.median(run[k] for run in runs) * 1e6 for k in ("wall", "client", "server")}
        names = sorted({name for run in runs for name in run["calls"]})
        calls = {name: statistics.median(run["calls"].get(name, (0, 0))[0] for run in runs) for name in names}
        usec = {name: statistics.median(run["calls"].get(name, (0, 0))[1] for run in runs) for name in names}
        by_command = ", ".join(f"{name} {calls[name]:.2f}, {usec[name]:.1f}" for name in names if calls[name] > 0.005)
        batched = [f"{1 / calls[name]:.1f}" if calls.get(name, 0) > 0.005 else "-" for name in BATCHED]
        lines.append(f"| {label} | {scenario} | {med['wall']:.1f} | {med['client']:.1f} | {med['server']:.1f} | "
                     f"{(med['client'] + med['server']) / 2:.1f} | {', '.join(batched)} | {by_command} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--languages", default=",".join(LANGUAGES))
    parser.add_argument("--editions", default="module")
    parser.add_argument("--inflight", default="64")
    parser.add_argument("--messages", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "results" / "clients-profile.md"))
    args = parser.parse_args()
    languages = [lang for lang in args.languages.split(",") if (HERE / "clients" / lang / "run").exists()]
    servers = start_servers(args.editions)
    sections = []
    try:
        for language in languages:
            for edition in args.editions.split(","):
                for inflight in (int(n) for n in args.inflight.split(",")):
                    print(f"== {language}, {edition}, {inflight} in flight", file=sys.stderr, flush=True)
                    figures = profile(language, servers[edition], edition, inflight, args.messages, args.rounds)
                    sections.append(table(language, edition, inflight, figures))
                    print(sections[-1], file=sys.stderr, flush=True)
    finally:
        for s in servers.values():
            s.close()
    header = (f"# Where a library's time per message goes\n\n"
              f"`make bench-clients-profile`: runs of {args.messages} and {2 * args.messages} messages, "
              f"the client's CPU from their difference (process start, build checks, JIT and warm-up cancel "
              f"out), the rest from the larger run, "
              f"median of {args.rounds} rounds, Redis 7.0.15 on this 2-core machine "
              f"({time.strftime('%Y-%m-%d')}). Client CPU is the program's own (getrusage), server CPU "
              f"from INFO CPU, calls from INFO commandstats.\n\n")
    Path(args.out).write_text(header + "\n".join(sections))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
