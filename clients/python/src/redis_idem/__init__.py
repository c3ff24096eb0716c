"""redis-idem for Python: the commands of the redis-idem module (or of its
Functions edition) for redis-py, sync and asyncio, standalone and cluster,
and the consumer loop built on them.

    import redis, redis_idem

    r = redis.Redis()
    idem = redis_idem.Idem(r, prefix="shop:", lease=30)
    result = idem.process("order:1001", lambda job: charge(order, fence=job.attempt))

    cmds = redis_idem.IdemCommands(r)          # one typed method per command
    reply = cmds.claim("order:1001", 30)        # ClaimReply(status=Status.NEW, ...)
"""

from ._aconsumer import AsyncIdem, AsyncJob
from ._commands import AsyncIdemCommands, IdemCommands, group_by_slot
from ._consumer import Idem, Job
from ._errors import (
    BusyError,
    ExhaustedError,
    IdemError,
    InvalidTokenError,
    LeaseLostError,
    MismatchError,
    NotInstalledError,
    ProcessError,
    ResultNotStoredError,
    ResultTooLargeError,
    StaleError,
    UnsupportedError,
    WrongTypeError,
)
from ._loop import Hooks, Settings, Stats
from ._operator import AsyncOperator, Operator
from ._protocol import MAX_BATCH
from ._replies import ClaimReply, DoneReply, Edition, FilterInfo, Record, RecordState, ShardInfo, Status
from .serializers import BytesSerializer, JsonSerializer, Serializer

__version__ = "0.1.0"


def idem(client, **kwargs):  # type: ignore[no-untyped-def]
    """The command group of a client, as `r.bf()` is redis-py's:
    `redis_idem.idem(r).claim(...)`; AsyncIdemCommands for asyncio clients."""
    import inspect

    if inspect.iscoroutinefunction(getattr(client, "execute_command", None)):
        return AsyncIdemCommands(client, **kwargs)
    return IdemCommands(client, **kwargs)


__all__ = [
    "AsyncIdem", "AsyncIdemCommands", "AsyncJob", "BusyError", "BytesSerializer", "ClaimReply", "DoneReply",
    "Edition", "ExhaustedError", "FilterInfo", "Hooks", "Idem", "IdemCommands", "IdemError", "InvalidTokenError",
    "Job", "JsonSerializer", "LeaseLostError", "MAX_BATCH", "MismatchError", "NotInstalledError", "ProcessError",
    "Record", "RecordState", "ResultNotStoredError", "ResultTooLargeError", "Serializer", "Settings", "ShardInfo",
    "StaleError", "Stats", "Status", "UnsupportedError", "WrongTypeError", "group_by_slot", "idem",
    "AsyncOperator", "Operator",
]
