"""A worker process for the killed-worker test: claims KEY through the
library with a LEASE-second lease, says so, and works until killed."""

import sys
import time

import redis

import redis_idem

url, key, lease = sys.argv[1], sys.argv[2], int(sys.argv[3])


def work(job):  # type: ignore[no-untyped-def]
    print(f"working attempt={job.attempt}", flush=True)
    while True:
        time.sleep(1)


redis_idem.Idem(redis.Redis.from_url(url), lease=lease).process(key, work)
