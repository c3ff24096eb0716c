"""A minimal redis-idem consumer loop with redis-py.

Usage: python python_consumer.py redis://127.0.0.1:6379 [messages]

Each message is processed once however often it is delivered: CLAIM before
the work, DONE after it (with the result to replay), RELEASE when the work
fails so that a retry can run at once. It prints how many deliveries did
work and how many were skipped as duplicates.
"""

import sys

import redis


def handle(r, business_id, work):
    """Process one delivery of `business_id`. Returns what happened."""
    key = f"example:py:{business_id}"
    status, value, attempt = r.execute_command("IDEM.CLAIM", key, 30)
    status = status.decode() if isinstance(status, bytes) else status
    if status in ("NEW", "RETRY", "SEEN"):
        token = value
        try:
            result = work(business_id, attempt)  # attempt: a fencing number for downstream writes
        except Exception:
            r.execute_command("IDEM.RELEASE", key, token)  # give it back: the next delivery retries
            return "released"
        r.execute_command("IDEM.DONE", key, token, "RESULT", result)
        return "processed"
    if status == "DONE":
        return "duplicate"  # already done: acknowledge, value is the stored result
    if status == "BUSY":
        return "busy"  # someone is on it: do not acknowledge, it comes back later
    return "dead-letter"  # MISMATCH or EXHAUSTED


def main():
    url = sys.argv[1] if len(sys.argv) > 1 else "redis://127.0.0.1:6379"
    messages = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    r = redis.Redis.from_url(url)
    done = []

    def work(business_id, attempt):
        done.append(business_id)
        return f"charged {business_id}"

    outcomes = {}
    # Every message is delivered twice, as at-least-once queues do.
    for business_id in list(range(messages)) * 2:
        outcome = handle(r, business_id, work)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    print(f"python: processed={outcomes.get('processed', 0)} duplicates={outcomes.get('duplicate', 0)}")
    assert sorted(done) == list(range(messages)), "each message worked on exactly once"
    assert outcomes == {"processed": messages, "duplicate": messages}, outcomes


if __name__ == "__main__":
    main()
