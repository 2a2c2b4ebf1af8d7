"""Queue workers: long-poll claims (ahead of free slots while tasks are
short), a pool of handler threads, fenced outcomes sent in batches, a
graceful drain on SIGTERM/SIGINT."""

import collections
import json
import logging
import os
import queue as _queue
import signal
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, List, Optional, Tuple

from . import _tracing
from ._transport import shutdown_socket, task_trace
from .errors import DroverError, Permanent, SessionNotFound, TransportError
from .agent import Sleep, WaitSignal, _received, _received_of
from .budgets import Deferral, run_budgeted
from .queues import MAX_CLAIM, Task
from ._reporting import _Reporting
from .sessions import Session
from .streams import StreamWriter

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

log = logging.getLogger("drover")

__all__ = ["Worker"]

Handler = Callable[[Task], Any]

# Tasks are claimed ahead of a free running slot while the worker's tasks
# take less than this on average (seconds) and none running has run longer:
# a claim's round trip is then most of a task's time. Longer tasks are not,
# so that a worker does not sit on tasks that others could run.
AHEAD_BELOW = 0.005
# The work (seconds, at the measured average task time) the tasks claimed
# ahead may hold: the longest a task waits in the worker for a slot.
AHEAD_WORK = 0.05
# How long a claim waits for room for half a claim before it claims less.
_GATHER = 0.003
# How long a claim waits for outcomes that are ready to be sent: the
# reporter claims with them (one request instead of two).
_DEFER = 0.005
# How long a task's last stream events may take to be stored before its
# outcome is sent anyway (the server away: the outcome has its own retries).
_STREAM_FLUSH_TIMEOUT = 30.0


class _Slot:
    """A session the worker claims under, and the tasks it holds under it
    whose outcomes are not yet reported."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.held = 0
        self.retiring = False


class Worker(_Reporting):
    """Runs a handler on the tasks of one queue.

    Made with the ``worker`` decorator::

        @client.worker("emails", concurrency=8)
        def send(task):
            deliver(task.params["to"])
            return {"sent": True}          # the task's result (any JSON value)

        send.run()                          # until SIGTERM or SIGINT

    The worker holds a session (kept alive every TTL/3), claims tasks with
    long polls as slots free up, runs the handler in a thread pool (never
    more than ``concurrency`` at once), and reports outcomes in batches
    through ``POST /v1/queues/{q}/outcomes``, each fenced by its claim's
    token: one request in flight at a time, carrying every outcome that
    became ready meanwhile (up to 256), and the worker's next claim when it
    has room and no claim is in flight.

    ``prefetch`` (default 100, the server's largest claim; 1 to 100) is
    the most tasks one claim takes and the most the worker holds ahead of
    its free running slots. While the worker's tasks take less than 5 ms on
    average and none running has run longer, it claims ahead of its free
    slots as many tasks as its slots finish in about 50 ms at the measured
    average (at most ``prefetch``), so that the next claim's round trip
    overlaps the work; they wait in the worker and start, in claim order,
    as slots free up. Otherwise it claims only for free slots, so that it
    does not sit on tasks other workers could run. ``prefetch=concurrency``
    is the Go worker's default. A task claimed ahead whose session is lost before it starts
    is not started (counted as ``lost``): it runs again elsewhere.

    A handler that returns succeeds; one that raises
    :class:`~drover.Permanent` sends the task to the dead-letter queue;
    any other exception is retried with the queue's backoff while the
    task's retry budget lasts. An outcome answered 409 belongs to a claim
    that was lost (the session expired and the task runs elsewhere): its
    result is dropped.

    SIGTERM or SIGINT (or :meth:`stop`) drains: no more claims, running
    tasks finish, tasks claimed ahead run too (no route hands a claim back,
    and they were claimed only while tasks took under 5 ms), their outcomes
    are sent, the session ends. A second signal is handled as the process's
    default again.

    The handler gets a :class:`~drover.Task` (a dict with ``id``, ``type``,
    ``params``, ``attempt``, ``token``), plus ``task.lost`` (the session's
    lost event: the claim may be gone once it is set) and
    ``task.heartbeat()`` (raises :class:`~drover.Fenced` once the claim is
    gone), and ``task.usage(tokens, headers=None)``: for a task whose
    metadata names a ``budget``, the worker reserves its
    ``estimated_tokens`` before the handler runs (without room, the task
    sleeps until the window turns, its attempt not counted) and settles
    after it with what the handler reported there (the provider's
    rate-limit headers too), or the estimate.

    ``wait`` bounds each claim's long poll (seconds): the server answers as
    soon as a task is claimed, and an idle worker asks again after ``wait``.
    ``ttl`` is the session's TTL: a worker that dies frees its tasks within
    it.
    """

    def __init__(
        self,
        client: Optional["Client"],
        queue: str,
        fn: Handler,
        *,
        concurrency: int = 8,
        ttl: int = 15,
        wait: float = 2.0,
        name: Optional[str] = None,
        prefetch: Optional[int] = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("drover: concurrency must be at least 1")
        if prefetch is not None and not (1 <= int(prefetch) <= MAX_CLAIM):
            raise ValueError("drover: prefetch must be between 1 and %d, not %r" % (MAX_CLAIM, prefetch))
        self._client = client
        self.queue = queue
        self.fn = fn
        self.concurrency = int(concurrency)
        self.prefetch = int(prefetch) if prefetch is not None else MAX_CLAIM
        self.ttl = int(ttl)
        self.wait = float(wait)
        self.name = name
        self.stats: Dict[str, int] = {
            "claimed": 0,
            "succeeded": 0,
            "failed": 0,
            "dead": 0,
            "slept": 0,
            "waited": 0,
            "deferred": 0,
            "lost": 0,
            "not_found": 0,
            "errors": 0,
            "ahead": 0,
            "claim_requests": 0,
            "outcome_requests": 0,
            "claims_with_outcomes": 0,
        }
        self.__name__ = getattr(fn, "__name__", "worker")
        self.__doc__ = getattr(fn, "__doc__", None)
        self._mu = threading.Lock()
        self._cond = threading.Condition(self._mu)
        # Tasks claimed whose handler has not returned: running, or claimed
        # ahead and waiting in _waiting for a thread.
        self._held = 0
        self._waiting: Deque[Tuple[_Slot, Task]] = collections.deque()
        # When each running handler started, by thread.
        self._active: Dict[int, float] = {}
        # A running average of how long handlers take, in seconds (0: none ran yet).
        self._task_time = 0.0
        self._stopping = threading.Event()
        self._claim_conn: Any = None
        self._slot: Optional[_Slot] = None
        self._slots: List[_Slot] = []
        self._outbox: "_queue.Queue[Optional[Tuple[_Slot, Dict[str, Any]]]]" = _queue.Queue()
        self._started = False
        # A claim is in flight: a claim request, or an outcome request that
        # carries the worker's next claim (the reporter's).
        self._claiming = False
        self._pool: Any = None
        self._max_tasks: Optional[int] = None
        # When the last claim (of either kind) brought tasks.
        self._last_task = time.monotonic()
        self.running = threading.Event()
        """Set once :meth:`run` has installed its signal handlers and claims."""

    def __call__(self, task: Any) -> Any:
        """Call the handler directly (tests, local runs)."""
        return self.fn(task)

    def __repr__(self) -> str:
        return "<drover.Worker %s on %r concurrency=%d prefetch=%d>" % (
            self.__name__,
            self.queue,
            self.concurrency,
            self.prefetch,
        )

    @property
    def client(self) -> "Client":
        if self._client is None:
            from . import default_client

            self._client = default_client()
        return self._client

    # -- control -----------------------------------------------------------

    def stop(self) -> None:
        """Drain: stop claiming (ending a claim's long poll at once), let
        running tasks finish, run the tasks claimed ahead, send their
        outcomes, then end the session. :meth:`run` returns once that is
        done. Safe from any thread and from a signal handler."""
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        shutdown_socket(self._claim_conn)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def waiting(self) -> int:
        """Tasks claimed ahead of a free running slot that wait for one now."""
        with self._mu:
            return len(self._waiting)

    def run(
        self,
        *,
        max_tasks: Optional[int] = None,
        idle_timeout: Optional[float] = None,
        duration: Optional[float] = None,
        handle_signals: bool = True,
    ) -> Dict[str, int]:
        """Work until stopped (SIGTERM, SIGINT, :meth:`stop`), or until
        ``max_tasks`` were claimed, or no task came for ``idle_timeout``
        seconds, or ``duration`` seconds passed; then drain. Returns the
        counts: claimed, succeeded, failed (to be retried), dead, slept, waited
        (tasks parked by a handler that returned a sleep), deferred (tasks
        handed back unrun to wait for their budget), lost (an
        outcome refused with 409, or a task claimed ahead and not started:
        the claim was lost), not_found, errors (outcomes that could not be
        sent), ahead (tasks claimed ahead of a free running slot, which
        waited for one), claim_requests and outcome_requests (requests
        sent) and claims_with_outcomes (outcome requests that carried the
        next claim)."""
        if self._started:
            raise RuntimeError("drover: a Worker runs once; make another")
        self._started = True
        client = self.client
        # Claims run on a connection of their own: stop() shuts it to end a
        # long poll without touching other requests.
        self._claim_client = client._clone(max_idle=1)
        restore: List[Tuple[int, Any]] = []
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                restore.append((sig, signal.getsignal(sig)))
                signal.signal(sig, self._on_signal)
        self._restore = restore
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="drover-task")
        self._pool = pool
        self._max_tasks = max_tasks
        self._last_task = time.monotonic()
        reporter = threading.Thread(target=self._report_loop, name="drover-outcomes", daemon=True)
        reporter.start()
        claimer = threading.Thread(
            target=self._claim_loop,
            args=(pool, max_tasks, idle_timeout, None if duration is None else time.monotonic() + duration),
            name="drover-claimer",
            daemon=True,
        )
        claimer.start()
        self.running.set()
        try:
            while claimer.is_alive():
                claimer.join(0.2)
        finally:
            self._stopping.set()
            claimer.join(10)
            with self._cond:  # a claim the reporter sent hands its tasks to the pool
                while self._claiming:
                    self._cond.wait(0.5)
            pool.shutdown(wait=True)
            self._outbox.put(None)
            reporter.join(max(30.0, self.ttl * 2.0))
            _tracing.flush()
            with self._mu:
                slots = list(self._slots)
            for s in slots:
                s.session.close()
            self._claim_client.close()
            self._restore_signals()
        return dict(self.stats)

    def _on_signal(self, signum: int, frame: Any) -> None:
        log.info("drover: worker %s got signal %d: draining", self.__name__, signum)
        self._restore_signals()
        self.stop()

    def _restore_signals(self) -> None:
        restore, self._restore = getattr(self, "_restore", []), []
        for sig, h in restore:
            try:
                signal.signal(sig, h)
            except (ValueError, TypeError):  # not the main thread, or a C handler
                pass

    # -- claims ------------------------------------------------------------

    def _current_slot(self) -> _Slot:
        with self._mu:
            slot = self._slot
        if slot is not None and not slot.session.lost.is_set() and not slot.retiring:
            return slot
        if slot is not None:
            self._retire(slot)
        s = Session(self.client, ttl=self.ttl, name=self.name)
        new = _Slot(s)
        with self._mu:
            self._slot = new
            self._slots.append(new)
        # The claims go with the session: tasks claimed ahead under it are
        # not started.
        s.on_lost(lambda _s: self._drop_waiting(new))
        return new

    def _retire(self, slot: _Slot) -> None:
        """Stop claiming under slot; end its session once its tasks are reported."""
        with self._mu:
            slot.retiring = True
            if self._slot is slot:
                self._slot = None
            done = slot.held == 0
            if done and slot in self._slots:
                self._slots.remove(slot)
        if done:
            slot.session.close()

    def _claim_loop(self, pool: Any, max_tasks: Optional[int], idle_timeout: Optional[float], until: Optional[float]) -> None:
        q = self._claim_client.queue(self.queue)
        backoff = 0.1
        try:
            while not self._stopping.is_set():
                with self._cond:
                    while (self._room() <= 0 or self._claiming) and not self._stopping.is_set():
                        self._cond.wait(0.5)
                    if self._held > 0:
                        # With tasks held, wait a moment for room for half
                        # a claim, so that one claim takes several tasks.
                        half = max(1, min(self.prefetch, self._cap()) // 2)
                        until_gathered = time.monotonic() + _GATHER
                        while self._room() < half and not self._stopping.is_set():
                            left = until_gathered - time.monotonic()
                            if left <= 0:
                                break
                            self._cond.wait(left)
                    # Outcomes about to go out carry the next claim (the
                    # reporter's): give it a moment to take them.
                    defer_until = time.monotonic() + _DEFER
                    while not self._claiming and not self._outbox.empty() and time.monotonic() < defer_until:
                        self._cond.wait(0.001)
                    if self._claiming:
                        continue
                    n = min(self._room(), self.prefetch, MAX_CLAIM)
                if self._stopping.is_set():
                    return
                if n <= 0:
                    continue
                if max_tasks is not None:
                    n = min(n, max_tasks - self.stats["claimed"])
                    if n <= 0:
                        return
                wait = self.wait
                now = time.monotonic()
                if until is not None:
                    if now >= until:
                        return
                    wait = min(wait, until - now)
                if idle_timeout is not None:
                    with self._mu:
                        last_task = self._last_task
                    if self._held == 0 and self._outbox.empty() and now - last_task >= idle_timeout:
                        return
                    wait = min(wait, max(0.05, idle_timeout - (now - last_task)))
                with self._mu:
                    if self._claiming:
                        continue  # the reporter's claim went first
                    # The reporter may have claimed since n was counted.
                    n = min(n, self._room())
                    if max_tasks is not None:
                        n = min(n, max_tasks - self.stats["claimed"])
                    if n <= 0:
                        continue
                    self._claiming = True
                try:
                    slot = self._current_slot()
                    with self._mu:
                        self.stats["claim_requests"] += 1
                    tasks = q.claim(slot.session, max=n, wait=wait, on_conn=self._set_claim_conn)
                    backoff = 0.1
                    # Handed to the pool before the claim counts as done
                    # (run() waits for that before it shuts the pool).
                    self._take(slot, tasks)
                except SessionNotFound:
                    slot.session._mark_lost("a claim found the session ended")
                    continue
                except TransportError as e:
                    if self._stopping.is_set():
                        if e.sent and self._slot is not None:
                            self._retire(self._slot)
                        return
                    if e.sent and self._slot is not None:
                        # The answer is lost but tasks may have been claimed:
                        # they are freed when that session ends, once the
                        # tasks it holds are reported.
                        log.warning("drover: a claim's answer was lost (%s): claiming under a new session", e)
                        self._retire(self._slot)
                    else:
                        log.warning("drover: claim failed: %s", e)
                    self._stopping.wait(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
                except DroverError as e:
                    log.warning("drover: claim failed: %s", e)
                    self._stopping.wait(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
                finally:
                    self._claim_conn = None
                    with self._cond:
                        self._claiming = False
                        self._cond.notify_all()
        except BaseException:  # noqa: BLE001
            log.exception("drover: the claim loop of worker %s stopped", self.__name__)
            raise

    def _take(self, slot: _Slot, tasks: List[Task]) -> None:
        """Queue claimed tasks for the handler threads, in claim order."""
        if not tasks:
            return
        with self._cond:
            self._last_task = time.monotonic()
            free = max(0, self.concurrency - self._held)
            self._held += len(tasks)
            slot.held += len(tasks)
            self.stats["claimed"] += len(tasks)
            self.stats["ahead"] += max(0, len(tasks) - free)
            claimed = time.time_ns()
            for t in tasks:
                t._claimed_ns = claimed  # type: ignore[attr-defined]  # its attempt's span starts there
                self._waiting.append((slot, t))
        if slot.session.lost.is_set():
            self._drop_waiting(slot)  # lost before they were queued
        for _ in tasks:
            self._pool.submit(self._run_next)

    def _next_claim(self, slot: _Slot) -> int:
        """How many tasks an outcome request of slot may claim as it goes
        (0: none): while the worker claims under slot's session, has room
        and no claim in flight, and is not stopping; with self._mu held,
        which it marks the claim in flight."""
        if self._claiming or self._stopping.is_set() or self._slot is not slot or slot.retiring or slot.session.lost.is_set():
            return 0
        n = min(self._room(), self.prefetch, MAX_CLAIM)
        if self._max_tasks is not None:
            n = min(n, self._max_tasks - self.stats["claimed"])
        if n > 0:
            self._claiming = True
        return max(0, n)

    def _cap(self) -> int:
        """The most tasks the worker may hold now (with self._mu held)."""
        return self.concurrency + self._ahead_limit()

    def _room(self) -> int:
        """How many more tasks the worker may claim now (with self._mu held)."""
        return self._cap() - self._held

    def _ahead_limit(self) -> int:
        """How many tasks may be held ahead of the running slots: none
        unless the handlers took under AHEAD_BELOW on average and none
        running has run longer, else about AHEAD_WORK of work at that
        average, at most prefetch (with self._mu held)."""
        if self._task_time <= 0 or self._task_time >= AHEAD_BELOW:
            return 0
        since = time.monotonic() - AHEAD_BELOW
        for started in self._active.values():
            if started < since:
                return 0
        return min(self.prefetch, max(1, int(self.concurrency * AHEAD_WORK / self._task_time)))

    def _drop_waiting(self, slot: _Slot) -> None:
        """Drop the tasks claimed ahead under a lost session: they run again
        elsewhere."""
        with self._cond:
            keep = collections.deque(e for e in self._waiting if e[0] is not slot)
            k = len(self._waiting) - len(keep)
            if not k:
                return
            self._waiting = keep
            self._held -= k
            self.stats["lost"] += k
            slot.held -= k
            done = slot.retiring and slot.held == 0
            if done and slot in self._slots:
                self._slots.remove(slot)
            self._cond.notify_all()
        log.info("drover: %d tasks claimed ahead were not started: their session was lost", k)
        if done:
            slot.session.close()

    def _set_claim_conn(self, conn: Any) -> None:
        self._claim_conn = conn
        if self._stopping.is_set():
            shutdown_socket(conn)

    # -- tasks -------------------------------------------------------------

    def _run_next(self) -> None:
        """Run the oldest task waiting for a thread (one pool job per task
        claimed; a job finds none when its task was dropped)."""
        with self._mu:
            if not self._waiting:
                return
            slot, task = self._waiting.popleft()
        if slot.session.lost.is_set():
            # Claimed ahead, and the claim went with its session before the
            # task started: it runs again elsewhere.
            with self._cond:
                self._held -= 1
                self.stats["lost"] += 1
                slot.held -= 1
                done = slot.retiring and slot.held == 0
                if done and slot in self._slots:
                    self._slots.remove(slot)
                self._cond.notify_all()
            if done:
                slot.session.close()
            return
        self._run_one(slot, task)

    def _run_one(self, slot: _Slot, task: Task) -> None:
        session = slot.session
        task.lost = session.lost  # type: ignore[attr-defined]
        task.session = session  # type: ignore[attr-defined]
        q = self.client.queue(self.queue)
        task.heartbeat = lambda: q.heartbeat(session, task.id, task.token or 0)  # type: ignore[attr-defined]
        stream = StreamWriter(self.client, task.id, session, task.token or 0)
        task.stream = stream  # type: ignore[attr-defined]
        outcome: Dict[str, Any] = {"task_id": task.id, "token": task.token}
        me = threading.get_ident()
        started = time.monotonic()
        with self._mu:
            self._active[me] = started
        parked = False
        # The attempt's span, when tracing is on: the handler's requests go under it.
        span = self._attempt_span(task)
        task.attempt_traceparent = span.traceparent if span is not None else task.traceparent  # type: ignore[attr-defined]
        traced = task_trace.set(task.attempt_traceparent)  # type: ignore[attr-defined]
        try:
            # A task whose metadata names a budget reserves its estimate first.
            result = run_budgeted(self.client, task, lambda: self._call(q, session, task))
            if result is _PARKED:
                parked = True
            elif isinstance(result, Deferral):
                # Not run: back PENDING after its delay, its attempt not
                # counted, tasks get saying it waits for its budget.
                outcome["defer"] = result.outcome()
            elif isinstance(result, Sleep):
                # Parked: SLEEPING, claimed again when the sleep ends, its attempt not counted.
                if result.sleep_until is not None:
                    outcome["sleep_until"] = result.sleep_until
                else:
                    outcome["sleep_for"] = result.sleep_for
            else:
                if result is not None:
                    json.dumps(result)  # a result that is not JSON fails the task, not the batch
                    outcome["result"] = result
                outcome["ok"] = True
        except Permanent as e:
            outcome["error"] = _describe(e) or "permanent failure"
            outcome["permanent"] = True
        except Exception as e:  # noqa: BLE001 - a task's failure, retried
            log.info("drover: task %s failed: %s", task.id, "".join(traceback.format_exception_only(type(e), e)).strip())
            outcome["error"] = _describe(e)
        finally:
            task_trace.reset(traced)
            took = time.monotonic() - started
            with self._cond:
                self._active.pop(me, None)
                self._held -= 1
                tt = self._task_time
                self._task_time = max(1e-9, took if tt == 0 else tt + (took - tt) / 8)
                self._cond.notify_all()
        try:
            # Its events are stored before its outcome: the outcome closes the stream.
            stream.flush(timeout=_STREAM_FLUSH_TIMEOUT)
        except (DroverError, TimeoutError) as e:
            log.info("drover: task %s: its stream's last events: %s", task.id, e)
        if parked:
            if span is not None and getattr(task, "_wait_lost", False):
                span.end("lost", "the wait was not stored: the claim was lost")
            elif span is not None:
                span.end("wait")
            self._parked(slot)
            return
        received = getattr(task, "_received_refs", None)
        if received and outcome.get("ok"):
            # The signals its waits were answered: a success consumes
            # them. A failure or a sleep consumes nothing (the next claim
            # resumes where this one did), so it does not name them.
            outcome["received_signals"] = received
        if stream.emitted:
            # The server ends its stream (done, or attempt_ended when it is
            # retried or sleeps) once the outcome is stored.
            outcome["streamed"] = True
        if span is not None:
            outcome[_tracing.SPAN_KEY] = span  # taken off before it is sent; ended with its answer
        self._outbox.put((slot, outcome))

    def _attempt_span(self, task: Task) -> Optional[_tracing.AttemptSpan]:
        """The span of an attempt at task, when tracing is on; None when it
        is off, or when the span cannot be made (tracing never stops a task)."""
        exp = _tracing.exporter()
        if exp is None:
            return None
        try:
            worker = self.name or "worker-%d" % os.getpid()
            return _tracing.AttemptSpan(exp, self.queue, task, worker, self.client.namespace or "", getattr(task, "_claimed_ns", None))
        except Exception as e:  # noqa: BLE001
            log.warning("drover: task %s: no span for its attempt: %s", task.id, e)
            return None

    def _call(self, q: Any, session: Session, task: Task) -> Any:
        """Runs the handler on task and returns what it returned, or
        _PARKED. A wait for a signal it returns (:func:`wait_signal`) is
        reported at once: a signal sent already is answered (not consumed),
        and the handler runs again with it (``task.received``,
        :func:`received_signal`); otherwise the task parked. Each later
        outcome of the claim names the signals answered so far
        (``received_signals``): a wait skips them, and a success or a park
        consumes them, fenced by the claim, so that a worker that dies first
        leaves them to the next claim. Any other outcome (a retry, a sleep,
        a dead letter) consumes nothing and its next claim resumes where
        this one did: at the wait it was claimed after, or from the start.
        A task claimed after such a
        wait (it shows ``waiting_for``) has the wait reported again first,
        to get what ended it."""
        wf = task.get("waiting_for") or {}
        wait: Optional[Dict[str, Any]] = None
        if wf.get("signals"):
            wait = {"names": list(wf["signals"])}
            if wf.get("until"):
                wait["until"] = wf["until"]
        task.received = None  # type: ignore[attr-defined]
        refs: List[Dict[str, str]] = []
        task._received_refs = refs  # type: ignore[attr-defined]
        for _ in range(_MAX_WAIT_RUNS):
            if wait is not None:
                if len(refs) >= _MAX_RECEIVED:
                    raise Permanent("the handler received %d signals in one claim, the most one outcome names" % _MAX_RECEIVED)
                got = self._wait(q, session, task, wait, refs)
                if got is None:
                    return _PARKED
                task.received = got  # type: ignore[attr-defined]
                if got.name and got.idempotency_key:
                    refs.append({"name": got.name, "idempotency_key": got.idempotency_key})
            _received.signal = task.received  # type: ignore[attr-defined]
            try:
                result = self.fn(task)
            finally:
                _received.signal = None
            if not isinstance(result, WaitSignal):
                return result
            wait = {"names": list(result.names)}
            if result.timeout is not None:
                wait["timeout"] = result.timeout
        raise Permanent("the handler waited for signals %d times in one claim" % _MAX_WAIT_RUNS)

    def _wait(self, q: Any, session: Session, task: Task, wait: Dict[str, Any], received: List[Dict[str, str]]) -> Any:
        """Reports the wait for a signal wait of task, naming the signals
        received under the claim: what the server answered it with at once,
        or None (the task parked, or the claim was lost), counted."""
        r = None
        o: Dict[str, Any] = {"task_id": task.id, "token": task.token, "wait_signal": wait}
        if received:
            o["received_signals"] = list(received)
        try:
            rs = q.outcomes(session, [o])
            r = rs[0] if rs else None
        except DroverError as e:
            log.warning("drover: task %s: reporting its wait failed: %s", task.id, e)
        if r is not None and r.ok and r.signal:
            return _received_of(r.signal)
        task._wait_lost = not (r is not None and r.ok)  # type: ignore[attr-defined]  # how its span ends
        with self._mu:
            self.stats["waited" if r is not None and r.ok else "lost"] += 1
        return None

    def _parked(self, slot: _Slot) -> None:
        """Settles a task whose wait parked it: nothing more to report."""
        with self._mu:
            slot.held -= 1
            done = slot.retiring and slot.held == 0
            if done and slot in self._slots:
                self._slots.remove(slot)
        if done:
            slot.session.close()

# _PARKED is what _call returns for a task its wait parked.
_PARKED = object()

# The most waits for a signal one claim's handler runs answer at once.
_MAX_WAIT_RUNS = 1000

# The most signals one outcome names received (the server's bound).
_MAX_RECEIVED = 64


def _describe(e: BaseException) -> str:
    msg = str(e)
    return "%s: %s" % (type(e).__name__, msg) if msg else type(e).__name__
