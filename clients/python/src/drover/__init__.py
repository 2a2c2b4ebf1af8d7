"""Python client of drover, the coordination plane for fleets of AI agents.

Sessions, locks with fencing tokens, durable queues and their workers,
agent tasks that resume after a crash, rate limits, quotas and breakers,
a registry with a live watch, and LangGraph-shaped checkpoints, over
drover's HTTP API. Standard library only.

Use a :class:`Client`::

    import drover
    client = drover.Client("http://127.0.0.1:8080")
    with client.lock("report-42", ttl=15, wait=10) as lk:
        ...

or the module-level functions, which use a default client configured by
:func:`configure` or by the environment (``DROVER_URL``, ``DROVER_TOKEN``,
``DROVER_NAMESPACE``, ``DROVER_CA_FILE``)::

    with drover.lock("report-42", wait=10) as lk:
        ...

:class:`PaxosLocks` is a client of the Paxos lock service (``drover paxos
serve``), which needs no etcd::

    locks = drover.PaxosLocks(["127.0.0.1:7100", "127.0.0.1:7101", "127.0.0.1:7102"])
    grant = locks.acquire("report-42", "worker-7", ttl=30)
"""

import logging
import os
import threading
from typing import Any, Optional

from ._version import __version__
from .agent import (
    BYTES_CODEC,
    JSON_CODEC,
    Codec,
    ReceivedSignal,
    RunResult,
    Sleep,
    WaitSignal,
    received_signal,
    sleep_for,
    sleep_until,
    wait_signal,
)
from .children import ChildFailed, SpawnChildren, StepChildren, spawn_children, step_children
from .checkpoint import WRITES_IDX_MAP, CheckpointClient, CheckpointTuple, JsonSerde, thread_config
from .budgets import Budgets
from .client import Client
from . import errors as _errors
from .errors import *  # noqa: F401,F403 (every error class, listed in errors.__all__)
from .locks import Lock
from .paxos import EndpointStatus, PaxosLockInfo, PaxosLocks
from .queues import OutcomeResult, Queue, Rejected, SubmitResult, Task
from .registry import Registration, Watch, WatchEvent
from .runstops import RunStopEvent, RunStops
from .streams import DROVER_EVENT_TYPES, Follow, StreamEvent, StreamWriter
from .stepstream import step_emit, step_stream, step_token
from .schedules import Schedules
from .sessions import Session
from .workers import Worker

__all__ = _errors.__all__ + [
    "__version__",
    "Client",
    "Session",
    "Lock",
    "PaxosLocks",
    "PaxosLockInfo",
    "EndpointStatus",
    "Queue",
    "Task",
    "Worker",
    "SubmitResult",
    "Rejected",
    "OutcomeResult",
    "RunResult",
    "Sleep",
    "sleep_for",
    "sleep_until",
    "WaitSignal",
    "wait_signal",
    "ReceivedSignal",
    "received_signal",
    "SpawnChildren",
    "spawn_children",
    "StepChildren",
    "step_children",
    "ChildFailed",
    "Follow",
    "StreamEvent",
    "StreamWriter",
    "step_emit",
    "step_stream",
    "step_token",
    "DROVER_EVENT_TYPES",
    "Codec",
    "JSON_CODEC",
    "BYTES_CODEC",
    "Registration",
    "Schedules",
    "Watch",
    "WatchEvent",
    "RunStops",
    "RunStopEvent",
    "CheckpointClient",
    "CheckpointTuple",
    "JsonSerde",
    "WRITES_IDX_MAP",
    "thread_config",
    # the default client
    "configure",
    "default_client",
    "session",
    "lock",
    "worker",
    "queue",
    "submit",
    "submit_ndjson",
    "run_steps",
    "signal",
    "follow",
    "register",
    "watch",
    "limits",
    "budgets",
    "Budgets",
    "quotas",
    "breakers",
    "checkpoints",
    "schedules",
]

# A library logs to "drover" and leaves the handlers to the application.
logging.getLogger("drover").addHandler(logging.NullHandler())

_default: Optional[Client] = None
_default_mu = threading.Lock()


def configure(url: Optional[str] = None, **kwargs: Any) -> Client:
    """Set the default client of the module-level functions (same arguments
    as :class:`Client`) and return it."""
    global _default
    c = Client(url or os.environ.get("DROVER_URL") or "http://127.0.0.1:8080", **kwargs)
    with _default_mu:
        old, _default = _default, c
    if old is not None:
        old.close()
    return c


def default_client() -> Client:
    """The default client: the one :func:`configure` made, or one from the
    environment (``DROVER_URL``, ``DROVER_TOKEN``, ``DROVER_NAMESPACE``,
    ``DROVER_CA_FILE``)."""
    global _default
    with _default_mu:
        if _default is None:
            _default = Client(
                os.environ.get("DROVER_URL") or "http://127.0.0.1:8080",
                token=os.environ.get("DROVER_TOKEN") or None,
                namespace=os.environ.get("DROVER_NAMESPACE") or None,
                ca_file=os.environ.get("DROVER_CA_FILE") or None,
            )
        return _default


def session(ttl: int = 15, name: Optional[str] = None) -> Session:
    """A session of the default client (see :meth:`Client.session`)."""
    return default_client().session(ttl=ttl, name=name)


def lock(name: str, ttl: int = 15, wait: Optional[float] = None, **kwargs: Any) -> Lock:
    """A lock of the default client (see :meth:`Client.lock`)."""
    return default_client().lock(name, ttl=ttl, wait=wait, **kwargs)


def worker(queue: str, concurrency: int = 8, **kwargs: Any) -> Any:
    """Decorator making a :class:`Worker` (see :meth:`Client.worker`); the
    default client is taken when the worker runs."""

    def wrap(fn: Any) -> Worker:
        return Worker(None, queue, fn, concurrency=concurrency, **kwargs)

    return wrap


def queue(name: str) -> Queue:
    return default_client().queue(name)


def submit(queue: str, tasks: Any) -> SubmitResult:
    return default_client().submit(queue, tasks)


def submit_ndjson(queue: str, source: Any) -> SubmitResult:
    return default_client().submit_ndjson(queue, source)


def run_steps(task_id: str, steps: Any, **kwargs: Any) -> RunResult:
    """See :meth:`Client.run_steps`."""
    return default_client().run_steps(task_id, steps, **kwargs)


def signal(task_id: str, name: str, data: Any = None, **kwargs: Any) -> Any:
    """See :meth:`Client.signal`."""
    return default_client().signal(task_id, name, data, **kwargs)


def follow(task_id: str, **kwargs: Any) -> Follow:
    """See :meth:`Client.follow`."""
    return default_client().follow(task_id, **kwargs)


def register(component: str, id: str, address: str, **kwargs: Any) -> Registration:
    return default_client().register(component, id, address, **kwargs)


def watch(component: str, **kwargs: Any) -> Watch:
    return default_client().watch(component, **kwargs)


class _Attr:
    """An attribute of the default client, looked up at each use."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, item: str) -> Any:
        return getattr(getattr(default_client(), self._name), item)

    def __repr__(self) -> str:
        return "<drover.%s of the default client>" % self._name


limits: Any = _Attr("limits")
budgets: Any = _Attr("budgets")
quotas: Any = _Attr("quotas")
breakers: Any = _Attr("breakers")
checkpoints: Any = _Attr("checkpoints")
schedules: Any = _Attr("schedules")
