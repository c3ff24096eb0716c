"""The loop's errors cross a process boundary: a Celery prefork child, a
multiprocessing pool or a concurrent.futures process pool pickles what its
work raised and the parent unpickles it (before the fix, every error with
arguments of its own failed there: TypeError, the pool's result lost)."""

from __future__ import annotations

import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

import redis_idem as ri


def _busy_in_a_child(url: str, key: str) -> None:
    import redis

    ri.Idem(redis.Redis.from_url(url), lease=30, wait=0).process(key, lambda job: None)


def test_an_error_of_the_loop_comes_back_from_a_process_pool(server, r, ns):  # type: ignore[no-untyped-def]
    key = f"{ns}held"
    ri.IdemCommands(r).claim(key, 30, owner="holder:1")
    with ProcessPoolExecutor(1) as pool:
        with pytest.raises(ri.BusyError) as busy:
            pool.submit(_busy_in_a_child, server.url, key).result(timeout=30)
    assert busy.value.key == key and 0 < busy.value.lease_left <= 30 and busy.value.owner == "holder:1"


@pytest.mark.parametrize("error", [
    ri.BusyError("k", 1.5, 3, "host:1"),
    ri.ExhaustedError("k", "3 tries used", 3),
    ri.LeaseLostError("k", "lost", 2),
    ri.MissingKeyError({"body": 1}, ValueError("no id")),
    ri.ResultNotStoredError("k", {"n": 1}, ValueError("too big"), 1),
    ri.HookError("k", "on_done", RuntimeError("hook"), {"n": 1}, 1),
    ri.DoneUnconfirmedError("k", {"n": 1}, ConnectionError("gone"), 1),
    ri.NotDurableError("k", "done", 0, 1, {"n": 1}, 2),
    ri.StaleError("STALE the token is not the claim's"),
])
def test_every_error_pickles_with_its_attributes(error):  # type: ignore[no-untyped-def]
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error) and copy.args == error.args
    assert {k: repr(v) for k, v in vars(copy).items()} == {k: repr(v) for k, v in vars(error).items()}
