"""A minimal redis-idem consumer loop with redis-py.

Usage: python python_consumer.py redis://127.0.0.1:6379 [messages]

Each message is processed once however often it is delivered: CLAIM before
the work, DONE after it (with the result to replay), RELEASE when the work
fails so that a retry can run at once. A copy that arrives while another
consumer is still working on the message waits for it (`WAIT`) and gets its
result, instead of `BUSY`. It prints how many deliveries did work, how many
were skipped as duplicates, and how many of those waited for the first copy.
"""

import sys
import time
from concurrent.futures import ThreadPoolExecutor

import redis

# How long a copy waits for the one in flight; redis-py's socket_timeout, if
# set, must be longer.
WAIT_MS = 5000


def handle(r, business_id, work):
    """Process one delivery of `business_id`. Returns what happened and the result."""
    key = f"example:py:{business_id}"
    status, value, attempt = r.execute_command("IDEM.CLAIM", key, 30, "WAIT", WAIT_MS)
    status = status.decode() if isinstance(status, bytes) else status
    if status in ("NEW", "RETRY", "SEEN"):
        token = value
        try:
            result = work(business_id, attempt)  # attempt: a fencing number for downstream writes
        except Exception:
            r.execute_command("IDEM.RELEASE", key, token)  # give it back: a waiting copy retries at once
            return "released", None
        r.execute_command("IDEM.DONE", key, token, "RESULT", result)  # wakes the copies waiting
        return "processed", result.encode()
    if status == "DONE":
        return "duplicate", value  # already done (or done while we waited): acknowledge, value is the result
    if status == "BUSY":
        return "busy", None  # still at work after WAIT_MS: do not acknowledge, it comes back later
    return "dead-letter", None  # MISMATCH or EXHAUSTED


def waits(r):
    """The server's count of waits: (waiting now, ended with the holder's DONE)."""
    info = r.info("idem")
    ended = sum(info[f"idem_wait_{how}"] for how in ("claimed", "done", "timeout", "unblocked"))
    return info["idem_wait_started"] - ended, info["idem_wait_done"]


def main():
    url = sys.argv[1] if len(sys.argv) > 1 else "redis://127.0.0.1:6379"
    messages = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    r = redis.Redis.from_url(url)
    other = redis.Redis.from_url(url)  # a second consumer, on its own connection
    done = []

    def work(business_id, attempt):
        done.append(business_id)
        return f"charged {business_id}"

    def slow_work(business_id, attempt):
        # The work takes a while: here, until the other copy waits on the
        # server (checked, so that the demo does not depend on timing), or
        # WAIT_MS if it never does.
        deadline = time.monotonic() + WAIT_MS / 1000
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
                copies = [handle(r, business_id, work), handle(r, business_id, work)]
            else:
                at_once = [pool.submit(handle, consumer, business_id, slow_work) for consumer in (r, other)]
                copies = [copy.result() for copy in at_once]
            for outcome, result in copies:
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                # Both copies of a message answer with the one result.
                assert result == f"charged {business_id}".encode(), (outcome, result)
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
