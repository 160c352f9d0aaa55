"""SIGINT / SIGTERM as a request to stop at the next boundary (a training step, an exported
clip): a leaf module, shared by training, export and evaluation."""
from __future__ import annotations

import contextlib
import signal
import sys
import threading


class StopSignals:
    """While active, SIGINT and SIGTERM only ask the loop to stop at its next step boundary
    (:attr:`requested`); a second signal stops at once, as without it. Handlers can only be
    set from the main thread: elsewhere this does nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.requested = False
        self._previous = {}

    def _handle(self, signum, frame):
        if self.requested:   # asked twice: stop now
            self.__exit__(None, None, None)
            raise KeyboardInterrupt
        self.requested = True
        print(f"\n{signal.Signals(signum).name}: stopping after this step (a checkpoint is "
              "written first; send it again to stop at once)", file=sys.stderr, flush=True)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        return False


@contextlib.contextmanager
def sigterm_as_interrupt():
    """While active, SIGTERM raises KeyboardInterrupt where it lands, as SIGINT does by
    default, so that a command ends through its own handler for Ctrl-C instead of being killed
    without a word. A :class:`StopSignals` inside takes both signals over while it is active.
    Main thread only: elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
