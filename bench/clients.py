"""make bench-clients: each library's loop against the hand-made pair.

For each library with a bench/clients/<language>/run program (the interface
is bench/clients/README.md), one Redis 7.0 with the module (and one without
it, functions/idem.lua loaded, for the Functions edition rows) serves every
side in turn, round by round, the order of the sides alternating. Each
figure is the median over the rounds of a timed run's wall time per
message, and of the server's CPU time per message (/proc/<pid>/stat over
the run, from INFO CPU); ratios are against the pair written with the same client.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import ROOT, Server

HERE = Path(__file__).resolve().parent
LANGUAGES = ["python", "node", "rust", "go", "java"]
# Python and Node have AWS Powertools' idempotency with a Redis layer.
POWERTOOLS = {"python", "node"}


def server_cpu(server):
    """The server's CPU seconds from INFO (getrusage, µs resolution; /proc's
    clock ticks are 10 ms, too coarse for a few µs per message)."""
    info = server.client.info("cpu")
    return info["used_cpu_user"] + info["used_cpu_sys"]


def run(language, server, impl, scenario, inflight, messages, prefix, edition, batch=None):
    """One run of a library's program: (wall seconds per message, server
    CPU seconds per message)."""
    cmd = [str(HERE / "clients" / language / "run"), "--url", f"redis://127.0.0.1:{server.port}",
           "--impl", impl, "--scenario", scenario, "--inflight", str(inflight),
           "--messages", str(messages), "--prefix", prefix, "--edition", edition]
    if batch is not None:
        cmd += ["--batch", batch]
    cpu_before = server_cpu(server)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    cpu = server_cpu(server) - cpu_before
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    n = result["messages"]
    return result["seconds"] / n, cpu / n


def sides(language, inflight):
    """The sides of one comparison: (label, impl, batch setting)."""
    out = [("hand-made pair", "pair", None), ("redis-idem process()", "idem", None)]
    if inflight > 1:
        out += [("process(), batch off", "idem", "off"), ("process(), batch on", "idem", "on")]
    if language in POWERTOOLS:
        out.append(("AWS Powertools idempotency", "powertools", None))
    return out


def measure(language, server, edition, inflight, messages, rounds):
    """{(label, scenario): [(wall, cpu) per round]}"""
    figures = {}
    for r in range(rounds):
        order = sides(language, inflight)
        if r % 2:
            order = order[::-1]
        for label, impl, batch in order:
            if impl == "powertools" and edition != "module":
                continue
            prefix = f"b:{language}:{edition}:{inflight}:{impl}:{batch}:{r}:{time.time_ns()}:"
            for scenario in ("first", "replay"):
                figure = run(language, server, impl, scenario, inflight, messages, prefix, edition, batch)
                figures.setdefault((label, scenario), []).append(figure)
        server.client.flushall()
    return figures


def table(language, edition, inflight, figures):
    lines = [f"### {language}, {edition}, {inflight} in flight", "",
             "| side | first run µs/msg | ratio | replay µs/msg | ratio | server CPU µs/msg (first, replay) | CPU ratio |",
             "|---|---|---|---|---|---|---|"]
    med = {k: (statistics.median(w for w, _ in v) * 1e6, statistics.median(c for _, c in v) * 1e6)
           for k, v in figures.items()}
    base_first = med.get(("hand-made pair", "first"))
    base_replay = med.get(("hand-made pair", "replay"))
    labels = []
    for label, _ in figures:
        if label not in labels:
            labels.append(label)
    for label in labels:
        f, r = med[(label, "first")], med[(label, "replay")]
        lines.append(f"| {label} | {f[0]:.1f} | {f[0] / base_first[0]:.2f}x | {r[0]:.1f} | "
                     f"{r[0] / base_replay[0]:.2f}x | {f[1]:.1f}, {r[1]:.1f} | "
                     f"{(f[1] + r[1]) / (base_first[1] + base_replay[1]):.2f}x |")
    return "\n".join(lines) + "\n"


def start_servers(editions):
    """The Redis 7.0 with the module, and for the Functions edition rows
    (when `editions` names it) one without it, functions/idem.lua loaded."""
    servers = {"module": Server(redisbloom=False)}
    if "functions" in editions:
        servers["functions"] = Server(redisbloom=False, module=False)
        lua = (ROOT / "functions" / "idem.lua").read_bytes()
        servers["functions"].client.execute_command("FUNCTION", "LOAD", "REPLACE", lua)
    return servers


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--languages", default=",".join(LANGUAGES))
    parser.add_argument("--editions", default="module,functions")
    parser.add_argument("--inflight", default="1,64")
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "results" / "clients.md"))
    args = parser.parse_args()
    languages = [l for l in args.languages.split(",") if (HERE / "clients" / l / "run").exists()]
    missing = set(args.languages.split(",")) - set(languages)
    if missing:
        print(f"no bench/clients/<language>/run for: {', '.join(sorted(missing))}", file=sys.stderr)
    servers = start_servers(args.editions)
    sections = []
    try:
        for language in languages:
            for edition in args.editions.split(","):
                for inflight in (int(n) for n in args.inflight.split(",")):
                    print(f"== {language}, {edition}, {inflight} in flight", file=sys.stderr, flush=True)
                    figures = measure(language, servers[edition], edition, inflight, args.messages, args.rounds)
                    sections.append(table(language, edition, inflight, figures))
                    print(sections[-1], file=sys.stderr, flush=True)
    finally:
        for s in servers.values():
            s.close()
    header = (f"# Client libraries against the hand-made pair\n\n"
              f"`make bench-clients`: {args.messages} messages per run, median of {args.rounds} rounds, "
              f"Redis 7.0.15 on this machine ({time.strftime('%Y-%m-%d')}). Ratios are against the "
              f"hand-made `SET NX PX` + `SET XX` pair (replay: one `GET`) written with the same client; "
              f"server CPU from INFO CPU over each run (the program's 200-message warm-up included, "
              f"alike on every side).\n\n")
    Path(args.out).write_text(header + "\n".join(sections))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
