"""A minimal redis-idem consumer with the redis-idem Python library.

Usage: python python_consumer.py redis://127.0.0.1:6379 [messages]

Each message is processed once however often it is delivered:
`idem.process_outcome(key, work)` claims the key, runs the work while the
library keeps the lease alive, and completes the record with the result
(or releases it if the work raised, so that a retry can run at once). A
copy that arrives while another consumer is still working on the message
waits for it (`WAIT` on the server) and gets its result. It prints how many
deliveries did work, how many were skipped as duplicates, and how many of
those waited for the first copy.
"""

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis

try:
    import redis_idem
except ImportError:  # run from a checkout whose venv predates the library: use its source
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python" / "src"))
    import redis_idem

WAIT = 5.0  # seconds a copy waits for the one in flight


def handle(idem, business_id, work):
    """Process one delivery of `business_id`. Returns what happened and the result."""
    try:
        # job.attempt: a fencing number for downstream writes
        outcome = idem.process_outcome(str(business_id), lambda job: work(business_id, job.attempt))
        if outcome.replayed:
            return "duplicate", outcome.value  # already done (or done while we waited): acknowledge
        return "processed", outcome.value
    except redis_idem.BusyError:
        return "busy", None  # still at work after WAIT: do not acknowledge, it comes back later
    except (redis_idem.MismatchError, redis_idem.ExhaustedError):
        return "dead-letter", None
    except Exception:
        return "released", None  # the work failed: the claim was given back, a retry runs at once


def waits(r):
    """The server's count of waits: (waiting now, ended with the holder's DONE)."""
    info = r.info("idem")
    ended = sum(info[f"idem_wait_{how}"] for how in ("claimed", "done", "timeout", "unblocked"))
    return info["idem_wait_started"] - ended, info["idem_wait_done"]


def main():
    url = sys.argv[1] if len(sys.argv) > 1 else "redis://127.0.0.1:6379"
    messages = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    r = redis.Redis.from_url(url)
    # Two consumers, each on its own connection pool.
    consumers = [redis_idem.Idem(redis.Redis.from_url(url), prefix="example:py:", lease=30, wait=WAIT)
                 for _ in range(2)]
    done = []

    def work(business_id, attempt):
        done.append(business_id)
        return f"charged {business_id}"

    def slow_work(business_id, attempt):
        # The work takes a while: here, until the other copy waits on the
        # server (checked, so that the demo does not depend on timing), or
        # WAIT if it never does.
        deadline = time.monotonic() + WAIT
        while waits(r)[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        return work(business_id, attempt)

    outcomes = {}
    waited_before = waits(r)[1]
    # Every message is delivered twice, as at-least-once queues do: the odd
    # ones one copy after the other (the second finds DONE), the even ones
    # to two consumers at once (one works, the other waits for its result).
    with ThreadPoolExecutor(2) as pool:
        for business_id in range(messages):
            if business_id % 2:
                copies = [handle(consumers[0], business_id, work), handle(consumers[0], business_id, work)]
            else:
                at_once = [pool.submit(handle, idem, business_id, slow_work) for idem in consumers]
                copies = [copy.result() for copy in at_once]
            for outcome, result in copies:
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                # Both copies of a message answer with the one result.
                assert result == f"charged {business_id}", (outcome, result)
    waited = waits(r)[1] - waited_before
    print(
        f"python: processed={outcomes.get('processed', 0)} duplicates={outcomes.get('duplicate', 0)}"
        f" waited={waited}"
    )
    assert sorted(done) == list(range(messages)), "each message worked on exactly once"
    assert outcomes == {"processed": messages, "duplicate": messages}, outcomes
    assert waited == (messages + 1) // 2, "each copy that arrived in flight waited for the first one"


if __name__ == "__main__":
    main()
