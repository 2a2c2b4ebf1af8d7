"""The stream of the agent-task step that runs in this thread.

A step of :meth:`drover.Client.run_steps` gets only its state; what it
emits goes through these functions, to the task's stream, under the
claim the step runs with::

    def think(state):
        for tok in model.stream(state["prompt"]):
            drover.step_token(tok)           # {"type": "token", "data": {"text": tok}}
        drover.step_emit("progress", {"done": 1, "of": 2})
        return state

Events are sent in the background, together; the step's events are
stored before its checkpoint is written (a step whose events are not
stored within 10 s fails, its checkpoint not written). Once the claim is lost they
raise :class:`drover.Fenced`, and nothing more is stored.
"""

import threading
from typing import Any, Optional

from .errors import DroverError
from .streams import StreamWriter

__all__ = ["step_stream", "step_emit", "step_token"]

_local = threading.local()

# How long a step's last events may take to be stored; past it the step
# fails and its checkpoint is not written.
_FLUSH_TIMEOUT = 10.0


def step_stream() -> Optional[StreamWriter]:
    """In a step of :meth:`drover.Client.run_steps`: the writer of the
    task's stream under the step's claim; ``None`` outside a step."""
    return getattr(_local, "writer", None)


def _writer() -> StreamWriter:
    w = step_stream()
    if w is None:
        raise DroverError("drover: step_emit runs only in a step of run_steps (a queue worker's task has task.stream)")
    return w


def step_emit(type: str, data: Any = None) -> None:
    """Queue an event of the running step's task (see
    :meth:`drover.StreamWriter.emit`); :class:`drover.DroverError`
    outside a step."""
    _writer().emit(type, data)


def step_token(text: str) -> None:
    """Queue a ``token`` event (``{"text": text}``) of the running step's task."""
    _writer().token(text)


class _StepStream:
    """Makes ``w`` the running step's writer for a ``with`` block, and
    stores its events on leaving (an error of the stream is the step's to
    see: the checkpoint's fence decides)."""

    def __init__(self, w: StreamWriter) -> None:
        self.w = w

    def __enter__(self) -> StreamWriter:
        _local.writer = self.w
        return self.w

    def __exit__(self, *exc: Any) -> None:
        _local.writer = None
        try:
            self.w.flush(timeout=_FLUSH_TIMEOUT)
        except DroverError:
            pass
        except TimeoutError:
            if exc[0] is not None:
                return  # the step's own error goes on
            # A write may still be under way: a checkpoint written now
            # could be followed by the step's events. The step fails.
            raise DroverError(
                "drover: the step's events were not stored within %s s; its checkpoint is not written" % _FLUSH_TIMEOUT
            ) from None
