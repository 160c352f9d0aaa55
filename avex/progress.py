"""Progress bars that stay readable when piped: tqdm, updated sparsely when its stream (stderr
unless ``file=`` says otherwise) is not a terminal, so a log file gets a line every
``PIPED_INTERVAL`` seconds, not one per step."""
from __future__ import annotations

import contextlib
import sys

from tqdm.asyncio import tqdm as _text_tqdm
from tqdm.auto import tqdm

__all__ = ["progress_bar", "show", "transformers_progress", "PIPED_INTERVAL"]

PIPED_INTERVAL = 30.0  # seconds between updates when the stream is a file or a pipe


def _is_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def progress_bar(iterable=None, **kwargs):
    """``tqdm(iterable, **kwargs)``; on a stream that is not a terminal, ``mininterval`` is
    ``PIPED_INTERVAL`` (an explicit ``mininterval`` wins) and ``maxinterval`` at least that much
    (tqdm's monitor thread would otherwise force a line every 10 s). A notebook widget, which
    redraws in place, keeps tqdm's defaults."""
    if tqdm is _text_tqdm and not _is_terminal(kwargs.get("file") or sys.stderr):
        kwargs.setdefault("mininterval", PIPED_INTERVAL)
        kwargs.setdefault("maxinterval", max(10.0, kwargs["mininterval"]))
    return tqdm(iterable, **kwargs)


def show(bar, text: str | None = None, **values) -> None:
    """Put ``text`` or ``values`` (name=value) beside ``bar``'s count at its next draw. Not
    drawn now: tqdm draws a postfix at once by default, which on a pipe wrote a line every step,
    each with the count as of the last draw (an iterated bar stores its count only when it
    draws)."""
    if text is not None:
        bar.set_postfix_str(text, refresh=False)
    else:
        bar.set_postfix(refresh=False, **values)


@contextlib.contextmanager
def transformers_progress(enabled: bool):
    """transformers' own bars ("Loading weights") on or off inside the block, as they were
    after it: ``--no-progress`` silences them too."""
    from transformers.utils import logging as hf_logging

    before = hf_logging.is_progress_bar_enabled()
    if not enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if before and not enabled:
            hf_logging.enable_progress_bar()
