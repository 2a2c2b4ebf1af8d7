"""LLM token budgets: a provider key's requests and tokens per window,
shared by tenants by weight; reserve an estimate before a model call,
settle with what it used."""

import json
import logging
import math
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Union

from ._transport import CONNECT, IDEMPOTENT, quote
from .agent import _duration_seconds
from .errors import DroverError, InvalidInput, NotFound, TooManyRequests, Unavailable

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

log = logging.getLogger("drover")

__all__ = ["Budgets", "BUDGET_HEADERS", "Deferral", "UnusableUsage", "provider_headers", "result_usage"]

#: The provider headers a settle reads (OpenAI's names; others send the same).
BUDGET_HEADERS = ("x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens")

#: Seconds a task waits between tries when its budget is not configured or
#: its estimate can never fit (as the Go worker's gate).
UNWAITABLE_SECONDS = 30


class Deferral:
    """A queue task handed back unrun for ``after`` seconds, its attempt not
    counted, because ``reason`` (``budget KEY: why``): what
    :func:`run_budgeted` returns when the task's budget has no room. The
    worker reports it as the outcome ``defer``, and ``tasks get`` shows
    the task's ``budget_wait``, as for a Go worker's budget gate."""

    __slots__ = ("after", "reason")

    def __init__(self, after: float, reason: str) -> None:
        self.after = after
        self.reason = reason

    def outcome(self) -> Dict[str, Any]:
        """The ``defer`` field of the task's outcome."""
        return {"after": "%g" % self.after, "reason": self.reason}

    def __repr__(self) -> str:
        return "Deferral(after=%r, reason=%r)" % (self.after, self.reason)


#: The longest deferral an outcome may ask for: the server refuses the
#: whole batch of outcomes over it.
MAX_DEFER_SECONDS = 86400


def defer_seconds(retry_after: Optional[float]) -> int:
    """How long a task waits for its budget after an answer with
    ``retry_after`` (None: none): at least a second, at most
    :data:`MAX_DEFER_SECONDS`, whatever a proxy's ``Retry-After`` says."""
    ra = retry_after or 1
    if not ra < MAX_DEFER_SECONDS:  # also inf and nan
        return MAX_DEFER_SECONDS
    return max(1, math.ceil(ra))


def wait_reason(key: str, why: str) -> str:
    """Why a task waits for budget ``key``, as its deferral records it and a
    Go worker's budget gate says it: ``budget KEY: why`` (a 429's detail
    says that already), at most the 1024 bytes the server keeps."""
    prefix = "budget %s: " % key
    reason = why if why.startswith(prefix) else prefix + why
    return reason.encode("utf-8")[:1024].decode("utf-8", "ignore")


def not_configured(key: str) -> str:
    """Why a task waits for budget ``key`` that nobody configured (a 404), as the Go gate says it."""
    return "not configured (drover budgets set %s --tokens N)" % key


def _detail(e: DroverError) -> str:
    return str(e.problem.get("detail") or e)


def provider_headers(headers: Any) -> Optional[Dict[str, str]]:
    """The provider's rate-limit headers of ``headers`` (a mapping, an
    ``http.client.HTTPMessage`` or an ``email.message.Message``: anything
    with ``items()``), lower-cased, others dropped; None when it has none."""
    if headers is None:
        return None
    out: Dict[str, str] = {}
    for k, v in headers.items():
        name = str(k).lower()
        if name in BUDGET_HEADERS and name not in out:
            out[name] = v[0] if isinstance(v, (list, tuple)) else str(v)
    return out or None


class Budgets:
    """LLM token budgets: ``client.budgets``.

    ::

        client.budgets.set("openai/gpt-4.1/key-prod", tokens=30000, requests=500, window_seconds=60)
        r = client.budgets.reserve("openai/gpt-4.1/key-prod", 1200, tenant="acme")
        resp = call_model(prompt)
        client.budgets.settle(r, resp.usage.total_tokens, headers=resp.headers)

    A reservation refused for now raises :class:`~drover.TooManyRequests`
    whose ``retry_after`` is the seconds until the window turns.
    """

    def __init__(self, client: "Client") -> None:
        self.client = client
        self._t = client._t

    def list(self) -> List[Dict[str, Any]]:
        """Every budget with its current window's use."""
        return list((self._t.request("GET", "/v1/budgets", retry=IDEMPOTENT).data or {}).get("data") or [])

    def get(self, key: str) -> Dict[str, Any]:
        """One budget: limits, ``used``, ``reserved``, ``remaining``,
        ``live`` reservations and ``tenant_usage``. :class:`~drover.NotFound`
        when not configured."""
        return self._t.request("GET", "/v1/budgets/%s" % quote(key), retry=IDEMPOTENT).data

    def set(
        self,
        key: str,
        *,
        tokens: int = 0,
        requests: int = 0,
        window_seconds: int = 0,
        caps: Optional[Mapping[str, int]] = None,
        weights: Optional[Mapping[str, float]] = None,
        estimates: Optional[Mapping[str, int]] = None,
    ) -> Dict[str, Any]:
        """Set (or create) a budget (admin role): ``tokens`` and ``requests``
        per window of ``window_seconds`` (default 60; 0 means no limit, one
        of the two is set), per-tenant ``caps`` and ``weights``, and default
        ``estimates`` by task type (a reservation, or queue task, that names
        its task type and no estimate holds its type's). The current
        window's counters and live reservations stay."""
        body: Dict[str, Any] = {}
        for name, v in (("tokens", tokens), ("requests", requests), ("window_seconds", window_seconds)):
            if v:
                body[name] = v
        if caps:
            body["caps"] = dict(caps)
        if weights:
            body["weights"] = dict(weights)
        if estimates:
            body["estimates"] = dict(estimates)
        return self._t.request("PUT", "/v1/budgets/%s" % quote(key), json_body=body, retry=IDEMPOTENT).data

    def delete(self, key: str) -> None:
        """Delete a budget with its counters and reservations (admin role)."""
        self._t.request("DELETE", "/v1/budgets/%s" % quote(key), retry=IDEMPOTENT)

    def reserve(self, key: str, estimate: int = 0, *, tenant: str = "", task_type: str = "", ttl_seconds: int = 0) -> Dict[str, Any]:
        """Hold ``estimate`` tokens and one request of the budget for
        ``tenant``, for ``ttl_seconds`` (1 to 3600, default 60) unless
        settled: then it is released. Returns the reservation (``id``,
        ``budget``, ``estimate``, ``settle_bound``, ``lease``...). Raises
        :class:`~drover.TooManyRequests` (with ``retry_after``) when the
        budget has no room for the tenant now; nothing is held then. Without
        ``estimate`` (or 0), ``task_type`` holds the budget's default
        estimate for that type. Never sent twice after a lost answer (it
        could have reserved)."""
        body: Dict[str, Any] = {}
        if estimate:
            body["estimate"] = estimate
        if task_type:
            body["task_type"] = task_type
        if tenant:
            body["tenant"] = tenant
        if ttl_seconds:
            body["ttl_seconds"] = ttl_seconds
        return self._t.request("POST", "/v1/budgets/%s/reserve" % quote(key), json_body=body, retry=CONNECT).data

    def settle(self, reservation: Mapping[str, Any], actual: int, *, headers: Any = None) -> Dict[str, Any]:
        """Settle ``reservation`` (as :meth:`reserve` returned it) with the
        tokens the call actually used: the difference to its estimate is
        refunded or charged. ``headers``, the provider's response headers,
        may carry ``x-ratelimit-remaining-tokens`` and
        ``x-ratelimit-reset-tokens``: when the provider says fewer remain,
        the difference counts as used until its reset (``corrected``).
        :class:`~drover.Conflict` (409) when the reservation is unknown,
        settled, or was released."""
        body: Dict[str, Any] = {"actual": actual}
        h = provider_headers(headers)
        if h:
            body["headers"] = h
        path = "/v1/budgets/%s/reservations/%s/settle" % (quote(reservation["budget"]), quote(reservation["id"]))
        return self._t.request("POST", path, json_body=body, retry=CONNECT).data


#: The most tokens a settle counts (a budget's ``MaxTokens`` on the
#: server): a result's usage counting more is not read.
MAX_USAGE_TOKENS = 1_000_000_000

#: The largest result :func:`result_usage` reads: 256 KiB of JSON, the most a task keeps.
_MAX_USAGE_RESULT = 256 << 10

#: The usage counts :func:`result_usage` reads, by shape in the order it
#: tries them: OpenAI's total, its prompt and completion, Anthropic's.
_USAGE_SHAPES = (
    ("total_tokens",),
    ("prompt_tokens", "completion_tokens"),
    ("input_tokens", "output_tokens", "cache_creation_input_tokens"),
)


class UnusableUsage(ValueError):
    """A result's ``usage`` whose ``field`` is not a whole number of tokens
    from 0 to :data:`MAX_USAGE_TOKENS` (``usage`` when a count is not a
    whole number at all): :func:`result_usage` raises it."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__("%s %s" % (field, reason))
        self.field = field


def result_usage(value: Any) -> Optional[int]:
    """The tokens a task's result says its model call used, as the Go
    worker's budget gate reads them (``budget.ResultUsage``): the result is
    a dict (a JSON object) of at most 256 KiB as JSON whose ``usage`` dict
    has ``total_tokens`` (OpenAI), else ``prompt_tokens`` plus
    ``completion_tokens``, else Anthropic's ``input_tokens`` plus
    ``output_tokens`` plus ``cache_creation_input_tokens`` (its rate limit
    counts cache writes; ``cache_read_input_tokens`` are not added); the
    sum counts at most :data:`MAX_USAGE_TOKENS`. None when the result says
    nothing of it; :class:`UnusableUsage`, naming the field, when a count
    is not a whole number from 0 to MAX_USAGE_TOKENS."""
    if not isinstance(value, dict) or "usage" not in value:
        return None
    try:
        size = len(json.dumps(value, separators=(",", ":")).encode())
    except (TypeError, ValueError):
        return None  # not JSON: the task fails
    usage = value["usage"]
    if size > _MAX_USAGE_RESULT or not isinstance(usage, dict):
        return None  # "usage" of another kind: not a model's usage
    counts: Dict[str, int] = {}
    for shape in _USAGE_SHAPES:
        for f in shape:
            v = usage.get(f)
            if v is None:
                continue
            # As JSON, a bool or a float (1.0 too) is not a whole number; nor
            # is what a 64-bit integer cannot hold.
            if isinstance(v, bool) or not isinstance(v, int) or not -(1 << 63) <= v < 1 << 63:
                raise UnusableUsage("usage", "its token counts must be whole numbers: %s is %r" % (f, v))
            counts[f] = v
    for shape in _USAGE_SHAPES:
        # A shape is named by its first two counts (cache writes alone are not a usage).
        if all(f not in counts for f in shape[:2]):
            continue
        total = 0
        for f in shape:
            if f not in counts:
                continue
            if not 0 <= counts[f] <= MAX_USAGE_TOKENS:
                raise UnusableUsage("usage." + f, "must be between 0 and %d, not %d" % (MAX_USAGE_TOKENS, counts[f]))
            total += counts[f]
        return min(total, MAX_USAGE_TOKENS)
    return None


class _Hold:
    """A task's reservation in a queue worker: settled once, with what the
    handler reported through ``task.usage(tokens, headers)``, else the
    usage of the result it returned (:func:`result_usage`), else the
    estimate."""

    def __init__(self, budgets: Budgets, reservation: Dict[str, Any]) -> None:
        self.budgets = budgets
        self.reservation = reservation
        self.tokens: Optional[int] = None
        self.result_tokens: Optional[int] = None
        self.headers: Any = None

    def used(self, tokens: int, headers: Any = None) -> None:
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ValueError("drover: usage tokens must be a whole number of at least 0, not %r" % (tokens,))
        self.tokens = tokens
        if headers is not None:
            self.headers = headers

    def returned(self, result: Any, task_id: Any) -> None:
        """Reads the usage of what the handler returned, to settle when it
        reported nothing itself (its report wins: the result is not read
        then). A usage that is not usable is logged; the estimate is
        settled. Only a dict is read: a sleep, a wait for a signal or a
        park is not a result."""
        if self.tokens is not None:
            return
        try:
            self.result_tokens = result_usage(result)
        except UnusableUsage as e:
            log.warning("drover: task %s: budget %s: the result's usage is not usable; its estimate is settled: %s", task_id, self.reservation["budget"], e)

    def settle(self) -> None:
        r = self.reservation
        tokens = self.tokens if self.tokens is not None else self.result_tokens
        actual = min(tokens if tokens is not None else r["estimate"], r["settle_bound"])
        self.budgets.settle(r, actual, headers=self.headers)


def _ignore_usage(tokens: int, headers: Any = None) -> None:
    """``task.usage`` of a task without a budget: nothing to settle."""


def _ttl(task: Any) -> int:
    """The seconds a task's reservation lives: its timeout plus 30 s, at
    least 60 and at most 3600; 300 for a task without a timeout."""
    try:
        timeout = _duration_seconds(task.get("timeout"), "timeout")
    except (TypeError, ValueError):
        timeout = 0.0
    return min(3600, max(60, math.ceil(timeout) + 30)) if timeout > 0 else 300


def run_budgeted(client: "Client", task: Any, call: Callable[[], Any]) -> Union[Deferral, Any]:
    """Runs ``call`` (a queue handler on ``task``) within the budget its
    metadata names (``budget``, ``estimated_tokens`` or else the budget's
    default for the task's type, ``tenant``): reserves
    the estimate first and returns a :class:`Deferral` instead (handed
    back unrun, no attempt counted) when the budget has no room, until the
    window turns; settles after
    ``call`` with what it reported through ``task.usage(tokens,
    headers=None)``, else the ``usage`` of the result it returned
    (:func:`result_usage`), else the estimate. A task without a budget
    runs as is."""
    task.usage = _ignore_usage
    meta = task.get("metadata") or {}
    key = meta.get("budget")
    if not key:
        return call()
    budgets = Budgets(client)
    try:
        r = budgets.reserve(
            key,
            int(meta.get("estimated_tokens") or 0),
            tenant=meta.get("tenant") or "",
            task_type=task.get("task_type") or "",
            ttl_seconds=_ttl(task),
        )
    except (TooManyRequests, Unavailable) as e:
        log.info("drover: task %s waits for budget %s: %s", task.get("task_id"), key, e)
        return Deferral(defer_seconds(e.retry_after), wait_reason(key, _detail(e)))
    except NotFound as e:
        log.warning("drover: task %s: budget %s: %s", task.get("task_id"), key, e)
        return Deferral(UNWAITABLE_SECONDS, wait_reason(key, not_configured(key)))
    except InvalidInput as e:
        log.warning("drover: task %s: budget %s: %s", task.get("task_id"), key, e)
        return Deferral(UNWAITABLE_SECONDS, wait_reason(key, _detail(e)))
    hold = _Hold(budgets, r)
    task.usage = hold.used
    try:
        result = call()
        hold.returned(result, task.get("task_id"))
        return result
    finally:
        try:
            hold.settle()
        except DroverError as e:
            log.warning("drover: task %s: settling budget %s failed: %s", task.get("task_id"), key, e)
