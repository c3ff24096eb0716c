"""redis-idem for Python: the consumer loop of the redis-idem module (or of
its Functions edition) for redis-py, sync and asyncio, standalone and
cluster, its typed commands, and an Idempotency-Key ASGI middleware.

    import redis, redis_idem

    idem = redis_idem.Idem(redis.Redis(), prefix="shop:", lease=30)
    result = idem.process("order:1001", lambda job: charge(order, fence=job.attempt))

    cmds = redis_idem.IdemCommands(redis.Redis())   # one typed method per command
    reply = cmds.claim("order:1001", 30)            # ClaimReply(status=Status.NEW, ...)
"""

from ._async import AsyncIdem
from ._codecs import BytesCodec, Codec, JsonCodec
from ._commands import AsyncIdemCommands, IdemCommands
from ._errors import (
    BusyError,
    DoneUnconfirmedError,
    ExhaustedError,
    HookError,
    IdemError,
    InvalidTokenError,
    LeaseLostError,
    LiveLeaseError,
    MismatchError,
    MissingKeyError,
    ModuleRequiredError,
    NotDurableError,
    NotInstalledError,
    RecordError,
    ResultNotStoredError,
    ResultTooLargeError,
    StaleError,
    WrongTypeError,
)
from ._job import BatchItem, Job, Outcome
from ._operator import AsyncOperator, Operator
from ._protocol import MAX_BATCH
from ._replies import (BatchStatus, ClaimReply, DoneItem, DoneReply, Edition, FilterInfo, Record, RecordState,
                       ReleaseItem, ShardInfo, Status)
from ._settings import DEFAULT_OWNER, Durable, Hooks, Settings, Stats
from ._sync import Idem

__version__ = "0.2.0"


def idem(client, **kwargs):  # type: ignore[no-untyped-def]
    """The command group of a client, as `r.bf()` is redis-py's:
    `redis_idem.idem(r).claim(...)`; AsyncIdemCommands for asyncio clients."""
    import inspect

    if inspect.iscoroutinefunction(getattr(client, "execute_command", None)):
        return AsyncIdemCommands(client, **kwargs)
    return IdemCommands(client, **kwargs)


__all__ = [
    "AsyncIdem",
    "AsyncIdemCommands",
    "AsyncOperator",
    "BatchItem",
    "BatchStatus",
    "BusyError",
    "BytesCodec",
    "ClaimReply",
    "Codec",
    "DEFAULT_OWNER",
    "DoneItem",
    "DoneReply",
    "DoneUnconfirmedError",
    "Durable",
    "Edition",
    "ExhaustedError",
    "FilterInfo",
    "HookError",
    "Hooks",
    "Idem",
    "IdemCommands",
    "IdemError",
    "InvalidTokenError",
    "Job",
    "JsonCodec",
    "LeaseLostError",
    "LiveLeaseError",
    "MAX_BATCH",
    "MismatchError",
    "MissingKeyError",
    "ModuleRequiredError",
    "NotDurableError",
    "NotInstalledError",
    "Operator",
    "Outcome",
    "Record",
    "RecordError",
    "RecordState",
    "ReleaseItem",
    "ResultNotStoredError",
    "ResultTooLargeError",
    "Settings",
    "ShardInfo",
    "StaleError",
    "Stats",
    "Status",
    "WrongTypeError",
    "idem",
]
