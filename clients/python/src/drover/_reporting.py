"""How a queue worker reports outcomes: in batches, one request in flight
at a time, each batch carrying the worker's next claim when it has room
(see Worker)."""

import logging
import queue as _queue
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from . import _tracing
from .errors import DroverError, TransportError
from .queues import MAX_OUTCOMES

if TYPE_CHECKING:  # pragma: no cover
    from .workers import _Slot

log = logging.getLogger("drover")


class _Reporting:
    """The outcome side of :class:`~drover.Worker` (a mixin: it uses the
    worker's lock, counts, slots and pool)."""

    _mu: threading.Lock
    _cond: threading.Condition
    _outbox: "_queue.Queue[Optional[Tuple[_Slot, Dict[str, Any]]]]"
    _claiming: bool
    stats: Dict[str, int]

    def _report_loop(self) -> None:
        q = self.client.queue(self.queue)
        closing = False
        while not closing:
            item = self._outbox.get()
            if item is None:
                break
            batch = [item]
            while len(batch) < MAX_OUTCOMES:
                try:
                    nxt = self._outbox.get_nowait()
                except _queue.Empty:
                    break
                if nxt is None:
                    closing = True
                    break
                batch.append(nxt)
            by_slot: Dict[int, Tuple[_Slot, List[Dict[str, Any]]]] = {}
            for slot, o in batch:
                by_slot.setdefault(id(slot), (slot, []))[1].append(o)
            for slot, outs in by_slot.values():
                self._send(q, slot, outs)

    def _send(self, q: Any, slot: "_Slot", outs: List[Dict[str, Any]]) -> None:
        session = slot.session
        spans = [o.pop(_tracing.SPAN_KEY, None) for o in outs]
        results = None
        sent_before = False
        delay = 0.1
        while results is None:
            if session.lost.is_set():
                break  # every claim of the session is gone: each would be a 409
            n = 0
            try:
                with self._mu:
                    self.stats["outcome_requests"] += 1
                    if not sent_before and len(outs) <= MAX_OUTCOMES:
                        n = self._next_claim(slot)
                if n > 0:
                    # The worker's next claim goes with the outcomes: one
                    # request instead of two.
                    with self._mu:
                        self.stats["claims_with_outcomes"] += 1
                    try:
                        results, tasks, claim_error = q.report(session, outs, n)
                        # Handed to the pool before the claim counts as done:
                        # run() waits for that before it shuts the pool.
                        self._take(slot, tasks)
                    finally:
                        with self._cond:
                            self._claiming = False
                            self._cond.notify_all()
                    if claim_error:
                        log.warning("drover: the claim sent with outcomes failed: %s", claim_error)
                else:
                    results = q.outcomes(session, outs)
            except DroverError as e:
                if n > 0 and isinstance(e, TransportError) and e.sent:
                    # The claim it carried may have taken tasks: claim under
                    # another session; the outcomes go again alone.
                    log.warning("drover: an outcome request's answer was lost (%s): claiming under a new session", e)
                    self._retire(slot)
                sent_before = sent_before or (isinstance(e, TransportError) and e.sent)
                if time.monotonic() >= session.deadline:
                    break
                log.warning("drover: sending %d outcomes failed (retrying): %s", len(outs), e)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
        if results is not None and sent_before:
            results = self._settled(q, outs, results)
        _tracing.end_attempts(spans, outs, results)
        with self._mu:
            if results is None:
                key = "lost" if session.lost.is_set() else "errors"
                self.stats[key] += len(outs)
            else:
                for o, r in zip(outs, results):
                    if r.status == 200:
                        if r.current_status == "DEAD":
                            self.stats["dead"] += 1
                        elif o.get("ok"):
                            self.stats["succeeded"] += 1
                        elif "sleep_for" in o or "sleep_until" in o:
                            self.stats["slept"] += 1
                        elif "defer" in o:
                            self.stats["deferred"] += 1
                        else:
                            self.stats["failed"] += 1
                    elif r.status == 409:
                        self.stats["lost"] += 1
                        log.warning("drover: task %s: outcome refused, the claim was lost (%s): result dropped", r.task_id, r.detail)
                    elif r.status == 404:
                        self.stats["not_found"] += 1
                    else:
                        self.stats["errors"] += 1
            slot.held -= len(outs)
            done = slot.retiring and slot.held == 0
            if done and slot in self._slots:
                self._slots.remove(slot)
        if done:
            session.close()

    def _settled(self, q: Any, outs: List[Dict[str, Any]], results: List[Any]) -> List[Any]:
        """results of outcomes sent again after a lost answer: a 409 may be
        the outcome's own first write, and counts as written when the task
        holds that token in the state the outcome leads to."""
        out = list(results)
        for i, (o, r) in enumerate(zip(outs, results)):
            if r.status != 409:
                continue
            try:
                t = q.get(o["task_id"])
            except DroverError:
                continue
            want = ("SUCCEEDED",) if o.get("ok") else ("RETRYING", "DEAD", "PENDING")
            if t.token == o.get("token") and t.status in want:
                out[i] = r._replace(status=200, current_status=t.status, attempt=t.attempt)
        return out
