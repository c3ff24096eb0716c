"""The real brokers these tests run against, each started once for the
session with brokers/launch.py (on free ports, under a temporary
directory) and stopped at its end."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

LAUNCH = Path(__file__).resolve().parents[4] / "brokers" / "launch.py"


def _broker(name: str):  # type: ignore[no-untyped-def]
    dir = Path(tempfile.mkdtemp(prefix=f"redis-idem-py-{name}-"))
    out = subprocess.run([sys.executable, str(LAUNCH), "start", name, "--dir", str(dir)],
                         check=True, capture_output=True, text=True)
    info = json.loads(out.stdout.strip().splitlines()[-1])
    try:
        yield info
    finally:
        subprocess.run([sys.executable, str(LAUNCH), "stop", "--dir", str(dir)], check=False)


@pytest.fixture(scope="session")
def kafka():  # type: ignore[no-untyped-def]
    yield from _broker("kafka")


@pytest.fixture(scope="session")
def nats_server():  # type: ignore[no-untyped-def]
    yield from _broker("nats")
