#!/usr/bin/env python3
"""The producer side: publish payments to the queue (a Redis Stream).

Publishing is at least once too. When Redis goes away after XADD was applied
but before the reply arrived, the producer cannot tell whether the message
is in the stream, so it publishes again: the same payment, a second stream
entry with a new id. That is fine, because consumers deduplicate by the
business id carried in the message (`id`), never by the stream entry id.

    python3 producer.py --count 100
"""

import argparse
import random
import time

from consumer import LOST, STREAM, Payment, connect


def publish(r, payment, on_retry=None, deadline_s=30.0):
    """XADD with retries; returns the stream entry id of the copy that was
    acknowledged. A retry after a lost reply may leave two copies."""
    give_up = time.monotonic() + deadline_s
    tries = 0
    while True:
        try:
            return r.xadd(STREAM, payment.fields()).decode()
        except LOST:
            tries += 1
            if time.monotonic() > give_up:
                raise
            if on_retry:
                on_retry(payment, tries)
            time.sleep(min(0.05 * tries, 0.5))


def main():
    p = argparse.ArgumentParser(description="publish payments")
    p.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--first", type=int, default=1, help="first payment number")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    rng = random.Random(args.seed)
    r = connect(args.redis)
    for n in range(args.first, args.first + args.count):
        payment = Payment(f"payment:{n}", f"acct:{n % 5}", rng.randint(100, 99_999), rng.randint(10, 200))
        print(payment.business_id, publish(r, payment))


if __name__ == "__main__":
    main()
