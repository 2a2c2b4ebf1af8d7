"""The client: one drover server (or a load balancer in front of several)."""

import ssl
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from . import agent as _agent
from . import locks as _locks
from . import registry as _registry
from . import streams as _streams
from ._transport import CONNECT, IDEMPOTENT, Transport, quote
from .agent import JSON_CODEC, AgentTasks, Codec, RunResult, Step
from .checkpoint import CheckpointClient
from .flow import Breakers, Limits, Quotas
from .budgets import Budgets
from .schedules import Schedules
from .locks import Lock
from .queues import Queue, SubmitResult, Task
from .errors import Conflict, InboxFull, TaskFinished
from .runstops import RunStops
from .registry import Registration, Watch
from .streams import Follow, StreamWriter
from .sessions import Session
from .workers import Worker

__all__ = ["Client"]


class Client:
    """A client of one drover server's HTTP API.

    ``url`` is the server (``http://127.0.0.1:8080``; ``https://`` for TLS).
    ``token`` is a bearer token (servers with ``--auth-file``);
    ``namespace`` is sent as ``Drover-Namespace`` on every request (the
    server's default without it). For HTTPS, ``ca_file`` names a CA bundle
    (PEM) to trust, or ``ssl_context`` is used as it is. ``timeout`` bounds
    each request, in seconds (long polls add their wait to it).

    Requests go over a pool of keep-alive connections; the client is safe to
    share between threads. A request is sent again after a connection error
    only when that is safe: when it never went out, or when it is a read, a
    keepalive or another request that cannot be applied twice. A claim is
    never sent twice.
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        token: Optional[str] = None,
        namespace: Optional[str] = None,
        *,
        ca_file: Optional[str] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
        timeout: float = 30.0,
        retries: int = 3,
        max_idle: int = 32,
    ) -> None:
        self.url = url
        self.token = token
        self.namespace = namespace
        self.timeout = float(timeout)
        self._opts: Dict[str, Any] = dict(
            token=token, namespace=namespace, ca_file=ca_file, ssl_context=ssl_context, timeout=timeout, retries=retries
        )
        self._t = Transport(url, max_idle=max_idle, **self._opts)
        self.limits = Limits(self)
        self.budgets = Budgets(self)
        self.quotas = Quotas(self)
        self.breakers = Breakers(self)
        self.agent_tasks = AgentTasks(self)
        self.checkpoints = CheckpointClient(self)
        self.schedules = Schedules(self)

    def _clone(self, max_idle: int = 32) -> "Client":
        return Client(self.url, max_idle=max_idle, **self._opts)

    def __repr__(self) -> str:
        return "<drover.Client %s%s>" % (self.url, " ns=%s" % self.namespace if self.namespace else "")

    def close(self) -> None:
        """Close the idle connections."""
        self._t.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- server ------------------------------------------------------------

    def ready(self) -> bool:
        """Whether the server is ready (``GET /readyz`` answers 200)."""
        try:
            self._t.request("GET", "/readyz", retry=IDEMPOTENT, retries=0)
            return True
        except Exception:  # noqa: BLE001
            return False

    def health(self) -> Dict[str, Any]:
        """``GET /readyz``: ``status``, ``store_full`` (raises when unready)."""
        return self._t.request("GET", "/readyz", retry=IDEMPOTENT).data

    # -- sessions and locks ------------------------------------------------

    def session(self, ttl: int = 15, name: Optional[str] = None) -> Session:
        """A new session kept alive in the background (see :class:`Session`)."""
        return Session(self, ttl=ttl, name=name)

    def lock(
        self,
        name: str,
        ttl: int = 15,
        wait: Optional[float] = None,
        *,
        session: Optional[Session] = None,
        holder: Optional[str] = None,
    ) -> Lock:
        """A lock to acquire with ``with`` (see :class:`Lock`)."""
        return Lock(self, name, ttl=ttl, wait=wait, session=session, holder=holder)

    def lock_status(self, name: str) -> Optional[Dict[str, Any]]:
        """Who holds lock ``name`` (token, waiters, seconds left), or ``None``."""
        return _locks.lock_status(self, name)

    def locks(self) -> List[Dict[str, Any]]:
        """Every held lock."""
        return _locks.list_locks(self)

    # -- queues ------------------------------------------------------------

    def queue(self, name: str) -> Queue:
        """Queue ``name``: submit, tasks, stats, cancel, ``dlq``, claims."""
        return Queue(self, name)

    def submit(self, queue: str, tasks: Sequence[Mapping[str, Any]]) -> SubmitResult:
        """Submit a list of tasks to ``queue`` (see :meth:`Queue.submit`)."""
        return self.queue(queue).submit(tasks)

    def submit_ndjson(self, queue: str, source: Union[str, bytes, Iterable[Any], Any]) -> SubmitResult:
        """Submit NDJSON to ``queue``, streamed (see :meth:`Queue.submit_ndjson`)."""
        return self.queue(queue).submit_ndjson(source)

    def task(self, queue: str, task_id: str) -> Task:
        return self.queue(queue).get(task_id)

    def worker(
        self,
        queue: str,
        concurrency: int = 8,
        *,
        ttl: int = 15,
        wait: float = 2.0,
        name: Optional[str] = None,
        prefetch: Optional[int] = None,
    ) -> Callable[[Callable[[Task], Any]], Worker]:
        """Decorator making a :class:`Worker` of a task handler::

            @client.worker("emails", concurrency=8)
            def send(task): ...

            send.run()

        ``prefetch`` (default ``concurrency``, at most 100) is the most
        tasks one claim takes, and how many it may claim ahead of a free
        slot while tasks take under 5 ms (see :class:`Worker`).
        """

        def wrap(fn: Callable[[Task], Any]) -> Worker:
            return Worker(self, queue, fn, concurrency=concurrency, ttl=ttl, wait=wait, name=name, prefetch=prefetch)

        return wrap

    def workers(self, queue: Optional[str] = None) -> List[Dict[str, Any]]:
        """The live Go queue workers (``drover workers --json``)."""
        return list(self._t.request("GET", "/v1/workers", query={"queue": queue}, retry=IDEMPOTENT).data or [])

    # -- agent tasks -------------------------------------------------------

    def run_steps(
        self,
        task_id: str,
        steps: Sequence[Step],
        *,
        session: Optional[Session] = None,
        ttl: int = 15,
        wait: Optional[float] = None,
        initial: Any = None,
        codec: Codec = JSON_CODEC,
        name: Optional[str] = None,
        resume_within: Union[int, float, str] = 0,
    ) -> RunResult:
        """Run agent task ``task_id`` step by step, resuming after a crash.

        Claims the task under ``session`` (or a session of its own with
        ``ttl``), waiting up to ``wait`` seconds for another worker's claim
        to end; reads its last checkpoint; runs only the steps after it,
        each as ``state = step(state)`` starting from the checkpointed
        state (``initial`` before any); writes each step's checkpoint fenced
        by the claim's token (:class:`Fenced` once the claim was lost: stop);
        the last step's write completes the task. A task completed before is
        not run again: its result comes back with ``ran == []``.

        A step that returns ``drover.sleep_for(d, state)`` or
        ``drover.sleep_until(t, state)`` ends the run once its state is
        written: the claim is released and the result's ``sleeping_until``
        says when the next step may run; a run before then runs nothing
        and says the same.

        A step that returns ``drover.wait_signal(names, timeout, state)``
        ends with a wait for a signal: its state is written with the wait
        and the claim released. The run claims the task again at once (a
        signal sent before the wait is kept for it), and for up to
        ``resume_within`` more, counted from each wait's start (seconds, or
        a duration such as ``"5m"``; every 0.2 to 2 s, holding nothing
        between, a task held by another process counting as still
        waiting); once the signal came or the wait timed out it goes on,
        the next step reading it with ``drover.received_signal()``.
        Otherwise it returns with ``waiting_for`` set: run it again once the
        signal was sent.

        A step that returns ``drover.spawn_children(children, wait, collect,
        state)`` ends by spawning child tasks: its state is written with the
        children's plan, they are submitted and the claim released; the run
        then claims the task again as for a signal, and once enough children
        ended the next step reads their outcomes with
        ``drover.step_children()``. A step that runs again after a crash
        spawns nothing twice.

        ``steps`` are callables or ``(name, callable)`` pairs. ``codec``
        turns states into checkpoint bytes: JSON by default,
        ``drover.BYTES_CODEC`` for raw bytes (what Go runners write).
        """
        return _agent.run_steps(
            self, task_id, steps, session=session, ttl=ttl, wait=wait, initial=initial, codec=codec, name=name,
            resume_within=resume_within,
        )

    # -- signals -----------------------------------------------------------

    def signal(
        self, task_id: str, name: str, data: Any = None, *, idempotency_key: Optional[str] = None
    ) -> Dict[str, Any]:
        """Send task ``task_id`` (a queue task, or an agent task with a
        checkpoint) the signal ``name`` with ``data`` (any JSON value, at
        most 64 KiB). It waits in the task's inbox until a step that waits
        for it consumes it; one sent before the wait is kept for it.

        The same name and ``idempotency_key`` sent again is stored and
        delivered once (``stored`` is then false); with a key the request
        is sent again after a broken connection. Answers ``{"task_id",
        "name", "idempotency_key", "stored", "woke", "current_status"}``.
        Raises :class:`NotFound` for an unknown task,
        :class:`TaskFinished` for a finished one, :class:`InboxFull` when
        1,000 signals wait unconsumed, :class:`InvalidInput` for a bad
        name, key or data.
        """
        body: Dict[str, Any] = {}
        if data is not None:
            body["data"] = data
        if idempotency_key:
            body["idempotency_key"] = idempotency_key
        try:
            return self._t.request(
                "POST", "/v1/tasks/%s/signals/%s" % (quote(task_id), quote(name)), json_body=body,
                retry=IDEMPOTENT if idempotency_key else CONNECT,
            ).data
        except Conflict as e:
            if isinstance(e, InboxFull) or e.kind != "conflict":
                raise
            # A finished task's 409 is the only plain conflict this route answers.
            raise TaskFinished(status=e.status, problem=e.problem, headers=e.headers) from e

    # -- streams -----------------------------------------------------------

    def follow(
        self,
        task_id: str,
        *,
        from_seq: Optional[int] = None,
        last_event_id: Optional[int] = None,
        idle_timeout: float = 45.0,
        max_backoff: float = 5.0,
        on_reconnect: Optional[Callable[[BaseException, int], None]] = None,
    ) -> Follow:
        """Follow a task's stream: an iterator of :class:`StreamEvent`, from
        the first event (or ``from_seq``, or after ``last_event_id``) until
        its ``done``, resuming with ``Last-Event-ID`` when the connection
        breaks. It may start before the task runs, while it runs or after
        it ended (within the stream's retention): every follower sees the
        same sequence. A connection silent for ``idle_timeout`` seconds is
        reopened; ``max_backoff`` caps the pause between reconnections, and
        ``on_reconnect(err, last_event_id)`` is called before each.
        :class:`NotFound` for an unknown task."""
        return Follow(
            self,
            task_id,
            from_seq=from_seq,
            last_event_id=last_event_id,
            idle_timeout=idle_timeout,
            max_backoff=max_backoff,
            on_reconnect=on_reconnect,
        )

    def stream_writer(self, task_id: str, session: Any, token: int) -> StreamWriter:
        """A writer of a task's stream under its claim (the session and token
        a claim returned): what a worker's ``task.stream`` is."""
        return StreamWriter(self, task_id, session, token)

    def stream_append(self, task_id: str, session: Any, token: int, events: List[Dict[str, Any]]) -> Dict[str, int]:
        """Append events (``{"type", "data"}``) in one request, fenced by the
        claim: ``{"first", "last"}``. :class:`Fenced` once the claim no
        longer holds, :class:`StreamFull` past a cap; nothing is stored then."""
        return _streams.append(self, task_id, session, token, events)

    def stream_read(self, task_id: str, from_seq: Optional[int] = None) -> Dict[str, Any]:
        """One page of stored events (at most 1,000) from ``from_seq``:
        ``{"events", "next", "done"}``, for clients that poll."""
        return _streams.read(self, task_id, from_seq)

    # -- registry ----------------------------------------------------------

    def register(
        self,
        component: str,
        id: str,
        address: str,
        *,
        data: Optional[Dict[str, Any]] = None,
        subject: Optional[str] = None,
        session: Optional[Session] = None,
        ttl: int = 15,
    ) -> Registration:
        """Register endpoint ``id`` of ``component`` at ``address`` under
        ``session`` (or one of its own): it disappears from every watcher
        when the registration is closed or the session ends."""
        return Registration(self, component, id, address, data=data, subject=subject, session=session, ttl=ttl)

    def deregister(self, component: str, id: str, session: Any) -> None:
        _registry.deregister(self, component, id, session)

    def endpoints(self, component: str) -> List[Dict[str, Any]]:
        """The live endpoints of ``component``."""
        return _registry.list_endpoints(self, component)

    def endpoint(self, component: str, id: str) -> Dict[str, Any]:
        return _registry.get_endpoint(self, component, id)

    def watch(
        self,
        component: str,
        *,
        last_event_id: Optional[str] = None,
        reconnects: Optional[int] = None,
        idle_timeout: float = 45.0,
    ) -> Watch:
        """Follow ``component``'s endpoints: an iterator of
        :class:`WatchEvent` (a ``snapshot``, then ``put`` and ``delete``),
        reconnecting with ``Last-Event-ID`` when the stream breaks."""
        return Watch(self, component, last_event_id=last_event_id, reconnects=reconnects, idle_timeout=idle_timeout)

    def run_stops(self, *, last_event_id: Optional[str] = None, keepalive: int = 5) -> RunStops:
        """Follow the stops of the namespace's Agent Server runs (``GET
        /v1/agent-server/runs/stops``): an iterator of :class:`RunStopEvent`
        (``stop`` per cancelled task of queue ``langgraph``, ``ready`` once
        live, ``reset`` when stops may have been missed), reconnecting with
        ``Last-Event-ID`` when the stream breaks. For a runtime: one stream
        instead of a read of each running run's task every while."""
        return RunStops(self, last_event_id=last_event_id, keepalive=keepalive)

    # -- checkpoints -------------------------------------------------------

    def checkpointer(self, serde: Any = None, mode: str = "append", lock: Any = None) -> CheckpointClient:
        """A :class:`CheckpointClient` with its own serializer, mode or lock
        (``client.checkpoints`` is one with JSON, append, no lock)."""
        return CheckpointClient(self, serde=serde, mode=mode, lock=lock)
