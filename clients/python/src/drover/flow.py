"""Fleet-wide rate limits, concurrency quotas and circuit breakers."""

import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from ._transport import CONNECT, IDEMPOTENT, format_duration, quote
from .errors import QuotaFull, RateLimited
from .sessions import Session

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

__all__ = ["Limits", "Quotas", "Breakers"]

_MAX_SERVER_WAIT = 55.0


def _sid(session: Any) -> str:
    return session if isinstance(session, str) else session.id


class Limits:
    """Shared token buckets: ``client.limits``."""

    def __init__(self, client: "Client") -> None:
        self.client = client
        self._t = client._t

    def take(self, name: str, n: int = 1, wait: Optional[float] = None) -> Dict[str, Any]:
        """Take ``n`` tokens of limit ``name``, waiting up to ``wait`` seconds.

        The server waits for the tokens within each request; when it answers
        429 the client sleeps its ``Retry-After`` (within what is left of
        ``wait``) and asks again. Raises :class:`RateLimited` (with
        ``retry_after``) when the tokens cannot come within ``wait``; nothing
        is taken then. Returns the limit after the take (``taken``,
        ``available``...). Settle with the count actually used.
        """
        path = "/v1/limits/%s/take" % quote(name)
        deadline = time.monotonic() + float(wait or 0)
        while True:
            left = deadline - time.monotonic()
            body: Dict[str, Any] = {"n": int(n)}
            server_wait = max(0.0, min(left, _MAX_SERVER_WAIT))
            if server_wait > 0.001:
                body["wait"] = format_duration(server_wait)
            try:
                return self._t.request(
                    "POST", path, json_body=body, retry=CONNECT, timeout=server_wait + self.client.timeout
                ).data
            except RateLimited as e:
                left = deadline - time.monotonic()
                if left <= 0.001:
                    raise
                ra = e.retry_after if e.retry_after is not None else 0.1
                if ra > left:
                    raise
                time.sleep(max(0.01, ra))

    def settle(self, name: str, reserved: int, used: int) -> Dict[str, Any]:
        """Give back ``reserved - used`` tokens (a negative difference is a debt)."""
        return self._t.request(
            "POST",
            "/v1/limits/%s/settle" % quote(name),
            json_body={"reserved": int(reserved), "used": int(used)},
            retry=CONNECT,
        ).data

    def get(self, name: str) -> Dict[str, Any]:
        return self._t.request("GET", "/v1/limits/%s" % quote(name), retry=IDEMPOTENT).data

    def list(self) -> List[Dict[str, Any]]:
        return list(self._t.request("GET", "/v1/limits", retry=IDEMPOTENT).data or [])

    def set(self, name: str, rate: str, burst: Optional[int] = None) -> Dict[str, Any]:
        """Set a limit (admin): ``rate`` as ``"90000/m"``, ``"20/s"``, ``"10/30s"``."""
        body: Dict[str, Any] = {"rate": rate}
        if burst is not None:
            body["burst"] = int(burst)
        return self._t.request("PUT", "/v1/limits/%s" % quote(name), json_body=body, retry=IDEMPOTENT).data

    def delete(self, name: str) -> None:
        self._t.request("DELETE", "/v1/limits/%s" % quote(name), retry=IDEMPOTENT)


class Quotas:
    """Concurrency quotas, their slots bound to a session: ``client.quotas``."""

    def __init__(self, client: "Client") -> None:
        self.client = client
        self._t = client._t

    def acquire(
        self, name: str, session: Session, subject: Optional[str] = None, wait: Optional[float] = None
    ) -> Dict[str, Any]:
        """Take a slot of quota ``name`` under ``session`` (for ``subject``: a
        tenant or task type), waiting up to ``wait`` seconds; raises
        :class:`QuotaFull` when none freed. The slot goes with the session."""
        path = "/v1/quotas/%s/acquire" % quote(name)
        deadline = time.monotonic() + float(wait or 0)
        while True:
            body: Dict[str, Any] = {"session": _sid(session)}
            if subject is not None:
                body["subject"] = subject
            left = deadline - time.monotonic()
            chunk = max(0.0, min(left, _MAX_SERVER_WAIT))
            if chunk > 0.001:
                body["wait"] = format_duration(chunk)
            try:
                return self._t.request(
                    "POST", path, json_body=body, retry=CONNECT, timeout=chunk + self.client.timeout
                ).data
            except QuotaFull:
                if time.monotonic() >= deadline - 0.001:
                    raise

    def release(self, name: str, session: Session, subject: Optional[str] = None) -> Dict[str, Any]:
        body: Dict[str, Any] = {"session": _sid(session)}
        if subject is not None:
            body["subject"] = subject
        return self._t.request("POST", "/v1/quotas/%s/release" % quote(name), json_body=body, retry=CONNECT).data

    def get(self, name: str) -> Dict[str, Any]:
        return self._t.request("GET", "/v1/quotas/%s" % quote(name), retry=IDEMPOTENT).data

    def list(self) -> List[Dict[str, Any]]:
        return list(self._t.request("GET", "/v1/quotas", retry=IDEMPOTENT).data or [])

    def set(self, name: str, limit: int, subject: Optional[str] = None) -> Dict[str, Any]:
        body: Dict[str, Any] = {"limit": int(limit)}
        if subject is not None:
            body["subject"] = subject
        return self._t.request("PUT", "/v1/quotas/%s" % quote(name), json_body=body, retry=IDEMPOTENT).data

    def delete(self, name: str) -> None:
        self._t.request("DELETE", "/v1/quotas/%s" % quote(name), retry=IDEMPOTENT)


class Breakers:
    """Fleet-wide circuit breakers: ``client.breakers``."""

    def __init__(self, client: "Client") -> None:
        self.client = client
        self._t = client._t

    def allow(self, name: str, call: Optional[str] = None) -> Dict[str, Any]:
        """May a call go through? Raises :class:`BreakerOpen` (with
        ``retry_after``) while the breaker is open. The answer's ``call`` id
        goes with the outcome (it matters for a half-open probe)."""
        body: Dict[str, Any] = {}
        if call:
            body["call"] = call
        return self._t.request("POST", "/v1/breakers/%s/allow" % quote(name), json_body=body, retry=CONNECT).data

    def outcome(self, name: str, ok: bool, call: Optional[str] = None) -> Dict[str, Any]:
        """Report a call's outcome (failures of the resource only)."""
        body: Dict[str, Any] = {"ok": bool(ok)}
        if call:
            body["call"] = call
        return self._t.request("POST", "/v1/breakers/%s/outcome" % quote(name), json_body=body, retry=CONNECT).data

    def get(self, name: str) -> Dict[str, Any]:
        return self._t.request("GET", "/v1/breakers/%s" % quote(name), retry=IDEMPOTENT).data

    def list(self) -> List[Dict[str, Any]]:
        return list(self._t.request("GET", "/v1/breakers", retry=IDEMPOTENT).data or [])

    def set(
        self,
        name: str,
        failures: Optional[int] = None,
        cooldown: Optional[float] = None,
        ratio: Optional[float] = None,
        window: Optional[float] = None,
        min_calls: Optional[int] = None,
    ) -> Dict[str, Any]:
        """Set a breaker's thresholds (admin); durations in seconds."""
        body: Dict[str, Any] = {}
        if failures is not None:
            body["failures"] = int(failures)
        if cooldown is not None:
            body["cooldown"] = format_duration(cooldown)
        if ratio is not None:
            body["ratio"] = float(ratio)
        if window is not None:
            body["window"] = format_duration(window)
        if min_calls is not None:
            body["min_calls"] = int(min_calls)
        return self._t.request("PUT", "/v1/breakers/%s" % quote(name), json_body=body, retry=IDEMPOTENT).data

    def reset(self, name: str) -> Dict[str, Any]:
        return self._t.request("POST", "/v1/breakers/%s/reset" % quote(name), retry=IDEMPOTENT).data

    def delete(self, name: str) -> None:
        self._t.request("DELETE", "/v1/breakers/%s" % quote(name), retry=IDEMPOTENT)
