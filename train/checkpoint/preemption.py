"""Preemption: `install_preemption_handler()` returns a flag that SIGTERM/SIGINT set; the loop
checks it each step, saves with `force=True`, calls `wait_until_finished()` and exits."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Sequence

log = logging.getLogger(__name__)


class PreemptionFlag:
    """Set by SIGTERM/SIGINT. `bool(flag)` is True once a stop was requested.

    Use as a context manager (or call `uninstall()`) to restore the previous handlers. A
    second SIGINT after a stop was requested raises KeyboardInterrupt (impatient Ctrl-C).
    """

    def __init__(self, signals: Sequence[int]):
        self.requested = False
        self.signal_name: str | None = None
        self._previous = {}
        for signum in signals:
            self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = self.signal_name or name
        log.warning("received %s: will save a checkpoint and stop after the current step", name)

    def __bool__(self) -> bool:
        return self.requested

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def __enter__(self) -> "PreemptionFlag":
        return self

    def __exit__(self, *exc_info) -> None:
        self.uninstall()


def install_preemption_handler(
    signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT),
) -> PreemptionFlag:
    """Installs handlers for `signals` (main thread only) and returns the flag they set.

    Loop pattern:
        with install_preemption_handler() as stop:
            for step in ...:
                ...train step...
                checkpointer.save(step, state=..., data_iterator=it)
                if stop:
                    checkpointer.save(step, state=..., data_iterator=it, force=True)
                    checkpointer.wait_until_finished()
                    break
    With several processes, a signal may reach only some of them: combine the flag across
    processes (or use `Checkpointer.reached_preemption(step)`) before acting on it.
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("install_preemption_handler: must be called from the main thread")
    return PreemptionFlag(signals)
