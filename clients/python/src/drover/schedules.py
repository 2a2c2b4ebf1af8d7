"""Schedules: tasks submitted at each tick of a cron expression or an
interval, once per tick across every server (``client.schedules``)."""

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Union

from ._transport import CONNECT, IDEMPOTENT, quote

if TYPE_CHECKING:
    from .client import Client

Duration = Union[str, int, float]

_DURATIONS = ("every", "catchup_window", "jitter")


def _body(fields: Dict[str, Any]) -> Dict[str, Any]:
    """The fields given (None: not given); seconds become Go durations."""
    out: Dict[str, Any] = {}
    for k, v in fields.items():
        if v is None:
            continue
        if k in _DURATIONS and not isinstance(v, str):
            v = "%gs" % float(v)
        out[k] = v
    return out


class Schedules:
    """Create, change, pause, trigger and read schedules.

    ``every``, ``catchup_window`` and ``jitter`` take seconds or a Go
    duration string ("30s", "1h"). A name in use raises
    :class:`drover.Conflict`; bad input, :class:`drover.InvalidInput`
    naming the field (a cron field by its position)."""

    def __init__(self, client: "Client") -> None:
        self.client = client
        self._t = client._t

    def create(
        self,
        name: str,
        *,
        queue: str,
        type: str,
        cron: Optional[str] = None,
        tz: Optional[str] = None,
        every: Optional[Duration] = None,
        params: Any = None,
        overlap: Optional[str] = None,
        catchup: Optional[str] = None,
        catchup_window: Optional[Duration] = None,
        jitter: Optional[Duration] = None,
        paused: Optional[bool] = None,
    ) -> Dict[str, Any]:
        body = _body(dict(queue=queue, type=type, cron=cron, tz=tz, every=every, params=params, overlap=overlap,
                          catchup=catchup, catchup_window=catchup_window, jitter=jitter, paused=paused))
        body["name"] = name
        return self._t.request("POST", "/v1/schedules", json_body=body, retry=CONNECT).data

    def list(self) -> List[Dict[str, Any]]:
        return list(self._t.request("GET", "/v1/schedules", retry=IDEMPOTENT).data["data"])

    def get(self, name: str) -> Dict[str, Any]:
        return self._t.request("GET", "/v1/schedules/%s" % quote(name), retry=IDEMPOTENT).data

    def update(self, name: str, **fields: Any) -> Dict[str, Any]:
        """Change the fields given (cron, tz, every, queue, type, params,
        overlap, catchup, catchup_window, jitter, paused); a change of when
        it fires moves it to its first tick from now."""
        return self._t.request("PATCH", "/v1/schedules/%s" % quote(name), json_body=_body(fields), retry=IDEMPOTENT).data

    def delete(self, name: str) -> None:
        self._t.request("DELETE", "/v1/schedules/%s" % quote(name), retry=IDEMPOTENT)

    def pause(self, name: str) -> Dict[str, Any]:
        return self._t.request("POST", "/v1/schedules/%s/pause" % quote(name), retry=IDEMPOTENT).data

    def resume(self, name: str) -> Dict[str, Any]:
        """Fire again from the next tick to come (the ticks of the pause do not fire)."""
        return self._t.request("POST", "/v1/schedules/%s/resume" % quote(name), retry=IDEMPOTENT).data

    def trigger(self, name: str) -> Dict[str, Any]:
        """Fire once now, with a task id of its own; never sent twice."""
        return self._t.request("POST", "/v1/schedules/%s/trigger" % quote(name), retry=CONNECT).data

    def history(self, name: str, limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """The latest fires, newest first: nominal_time, submitted_at, task_id, outcome."""
        q = {"limit": limit} if limit is not None else None
        return list(self._t.request("GET", "/v1/schedules/%s/history" % quote(name), query=q, retry=IDEMPOTENT).data["data"])
