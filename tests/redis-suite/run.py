#!/usr/bin/env python3
"""Redis's own test suite, with and without the module: `make test-redis-suite`.

Runs units of Redis 7.0.15's test suite (tests/redis-suite/redis-7.0.15:
the release's unmodified files these units need, as in
../shared/redis-tests-7.0.15; copied under target/redis-suite/) against
Debian's redis-server in three variants:

  plain   without the module: the baseline, run now, never a stored list;
  loaded  with `loadmodule <module>`;
  armed   with `loadmodule <module> wait-hooks-at-load yes`: on Redis 7.0 the
          module hears every data type's writes from the start, as it does
          after the first IDEM.CLAIM ... WAIT.

A test that passes without the module must pass with it, loaded and armed:
any that does not is listed, and the run fails. A unit with such a failure
is run once more in that variant: a test that then passes failed under
load only, and is listed as flaky without failing the run.

Each unit of each variant is its own `tclsh tests/test_helper.tcl --single
<unit>` (the suite falls back to one client on a loaded machine anyway), run
by a pool of workers, longest units first, each worker in its own copy of
the suite (the suite empties its tests/tmp when it starts);
integration/replication (6.5 minutes in one piece) is split into its
top-level blocks (split_unit.tcl).
Each worker has its own range of ports, 2000-6800 for 8 workers: no other
test binds those (the Rust tests take the kernel's ephemeral ports, from
32768, and the cluster tests 12000-32700). The suite also probes that
port + 10000 is free before it uses a port (a moment's bind, never a
server): a probe that meets a cluster test's port skips it.
"""

import argparse
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from queue import Queue

HERE = Path(__file__).resolve().parent

# The units issue 35 names, and unit/acl, longest first (the pool starts
# them in this order).
UNITS = [
    "integration/replication",
    "unit/expire",
    "unit/type/list",
    "unit/latency-monitor",
    "unit/type/string",
    "unit/scan",
    "unit/acl",
    "unit/type/hash",
    "unit/keyspace",
    "unit/info",
    "unit/pubsub",
]
# Split into one unit per top-level block; the blocks that take over 30 s
# (of 6.5 minutes) start first.
SPLIT = {"integration/replication": ["part04", "part05", "part09", "part08"]}

BINARIES = ["redis-server", "redis-cli", "redis-benchmark", "redis-check-aof", "redis-check-rdb"]

# (name, module arguments after the path, or None for no module)
VARIANTS = [
    ("plain", None),
    ("loaded", []),
    ("armed", ["wait-hooks-at-load", "yes"]),
]

# Worker w's servers take ports FIRST_PORT + w * PORTS_PER_WORKER onwards;
# the suite's own client port comes from the 32 below them.
FIRST_PORT = 2000
PORTS_PER_WORKER = 600
CLIENT_PORTS = 32

ANSI = re.compile(r"\x1b\[[0-9;]*m")
OK = re.compile(r"^\[ok\]: (.*) \(\d+ ms\)$")
ERR = re.compile(r"^\[err\]: (.*) in tests/\S+\.tcl$")


class Result:
    """What one unit printed: its passed tests (by name, counted: a name may
    recur), failed tests, and exceptions (which end the unit)."""

    def __init__(self, log: Path):
        self.ok = Counter()
        self.err = []
        self.exceptions = []
        self.seconds = 0.0
        self.log = log
        lines = ANSI.sub("", log.read_text(errors="replace")).splitlines()
        for index, line in enumerate(lines):
            if match := OK.match(line):
                self.ok[match.group(1)] += 1
            elif match := ERR.match(line):
                self.err.append(match.group(1))
            elif line.startswith("[exception]"):
                self.exceptions.append("\n".join(lines[index : index + 8]))

    def lost(self, baseline: "Result") -> list[str]:
        """Tests that passed in `baseline` and not here (failed, or never
        ran because the unit ended early)."""
        return sorted(name for name in baseline.ok if self.ok[name] < baseline.ok[name])


def prepare(suite: Path, work: Path) -> list[str]:
    """A writable copy of the suite at `work`, with src/ linking Debian's
    binaries; returns the units to run there, longest first."""
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(suite, work, symlinks=True)
    (work / "src").mkdir(exist_ok=True)
    for binary in BINARIES:
        path = shutil.which(binary)
        if path is None:
            sys.exit(f"redis-suite: {binary} not found (Debian's redis-server and redis-tools)")
        (work / "src" / binary).symlink_to(path)
    units = []
    for unit in UNITS:
        if unit not in SPLIT:
            units.append(unit)
            continue
        parts = subprocess.run(
            ["tclsh", str(HERE / "split_unit.tcl"), "tests", unit],
            cwd=work, check=True, capture_output=True, text=True,
        ).stdout.split()
        first = [f"{unit}.{part}" for part in SPLIT[unit]]
        units[:0] = [part for part in first if part in parts]
        units.extend(part for part in parts if part not in first)
    return units


class Pool:
    """Runs units on `workers` threads, each with its own port range."""

    def __init__(self, root: Path, module: Path, workers: int):
        self.root, self.module = root, module
        self.slots = Queue()
        for worker in range(workers):
            self.slots.put(worker)
        self.executor = ThreadPoolExecutor(workers)
        self.lock = threading.Lock()

    def submit(self, variant: str, module_args, unit: str, attempt: str):
        return self.executor.submit(self.run, variant, module_args, unit, attempt)

    def run(self, variant: str, module_args, unit: str, attempt: str) -> Result:
        worker = self.slots.get()
        try:
            base = FIRST_PORT + worker * PORTS_PER_WORKER + CLIENT_PORTS
            args = ["tclsh", "tests/test_helper.tcl", "--clients", "1", "--single", unit,
                    "--baseport", str(base), "--portcount", str(PORTS_PER_WORKER - CLIENT_PORTS)]
            if module_args is not None:
                args += ["--config", "loadmodule", " ".join([str(self.module), *module_args])]
            logs = self.root / "logs" / variant
            logs.mkdir(parents=True, exist_ok=True)
            log = logs / f"{unit.replace('/', '_')}{attempt}.log"
            started = time.monotonic()
            with open(log, "w") as out:
                subprocess.run(args, cwd=self.root / f"worker{worker}", stdout=out, stderr=subprocess.STDOUT)
            result = Result(log)
            result.seconds = time.monotonic() - started
            return result
        finally:
            self.slots.put(worker)


def describe(failing: list[tuple[str, str, str]], results: dict) -> list[str]:
    """The failures, unit by unit: each test that failed, and the tests
    that never ran because the unit ended early, counted with the reason."""
    lines = []
    units = sorted({(variant, unit) for variant, unit, _ in failing})
    for variant, unit in units:
        result = results[variant, unit]
        tests = [test for of, at, test in failing if (of, at) == (variant, unit)]
        failed = [test for test in tests if test in result.err]
        missing = [test for test in tests if test not in result.err]
        lines.extend(f"  {variant}: {unit}: {test}" for test in failed)
        if missing:
            why = result.exceptions[0].splitlines()[0] if result.exceptions else f"see {result.log}"
            shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
            lines.append(f"  {variant}: {unit}: {len(missing)} test(s) did not run ({shown}): {why}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--module", required=True, type=Path)
    parser.add_argument("--suite", required=True, type=Path, help="the stored tests (redis-tests-7.0.15)")
    parser.add_argument("--work", required=True, type=Path, help="a writable directory (under target/)")
    parser.add_argument("--workers", type=int, default=8, help="units run at once, over all variants")
    options = parser.parse_args()
    module, suite, root = options.module.resolve(), options.suite.resolve(), options.work.resolve()
    if not (suite / "tests" / "test_helper.tcl").is_file():
        sys.exit(f"redis-suite: no Redis test suite at {suite} (make test-redis-suite REDIS_SUITE=<its directory>)")
    if not module.is_file():
        sys.exit(f"redis-suite: no module at {module}: make build first")
    if FIRST_PORT + options.workers * PORTS_PER_WORKER > 12_000:
        sys.exit("redis-suite: too many workers for the port ranges below 12000")
    root.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(root / "logs", ignore_errors=True)

    started = time.monotonic()
    # A copy per worker: the suite empties its tests/tmp when it starts.
    copies = [prepare(suite, root / f"worker{worker}") for worker in range(options.workers)]
    units = copies[0]
    pool = Pool(root, module, options.workers)
    # Unit by unit across the variants, so that the long ones of every
    # variant start first.
    futures = {}
    for unit in units:
        for variant, module_args in VARIANTS:
            futures[variant, unit] = pool.submit(variant, module_args, unit, "")
    results = {key: future.result() for key, future in futures.items()}

    # Units that lost tests with the module run once more.
    lost = {}
    for (variant, unit), result in results.items():
        if variant != "plain" and (tests := result.lost(results["plain", unit])):
            lost[variant, unit] = tests
    args_of = dict(VARIANTS)
    reruns = {key: pool.submit(key[0], args_of[key[0]], key[1], ".rerun") for key in lost}
    flaky, failing = [], []
    for (variant, unit), tests in sorted(lost.items()):
        rerun = reruns[variant, unit].result()
        for test in tests:
            passed_alone = rerun.ok[test] >= results["plain", unit].ok[test]
            (flaky if passed_alone else failing).append((variant, unit, test))
    wall = time.monotonic() - started

    report = [f"Redis 7.0.15's own tests ({', '.join(UNITS)}) in three variants, "
              f"{options.workers} units at a time: {wall:.0f} s wall (logs: {root / 'logs'})."]
    for variant, _ in VARIANTS:
        mine = [result for (of, _), result in results.items() if of == variant]
        report.append(f"  {variant}: {sum(sum(r.ok.values()) for r in mine)} passed, "
                      f"{sum(len(r.err) for r in mine)} failed, "
                      f"{sum(len(r.exceptions) for r in mine)} unit(s) ended by an exception")
    baseline_trouble = [
        (unit, r) for (variant, unit), r in results.items() if variant == "plain" and (r.err or r.exceptions)
    ]
    if baseline_trouble:
        report.append("Failed without the module as well (not compared):")
        for unit, result in baseline_trouble:
            report.extend(f"  {unit}: {test}" for test in result.err)
            report.extend(f"  {unit}: {text}" for text in result.exceptions)
    for variant, unit, test in flaky:
        report.append(f"  flaky, {variant}: {unit}: {test} (failed once, passed when run again)")
    if failing:
        report.append("Tests that pass without the module and fail with it:")
        report.extend(describe(failing, results))
    else:
        report.append("No test fails only with the module, loaded or armed.")
    text = "\n".join(report)
    (root / "summary.txt").write_text(text + "\n")
    print(text)
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
