"""progress_bar: one line per PIPED_INTERVAL seconds on a pipe or file, tqdm's usual updates on a
terminal. A fake clock makes each step last a second."""
import io

import pytest
import tqdm.std

from avex.progress import PIPED_INTERVAL, progress_bar, show


class Stream(io.StringIO):
    def __init__(self, terminal: bool):
        super().__init__()
        self.terminal = terminal

    def isatty(self):
        return self.terminal


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(tqdm.std, "time", lambda: now[0])
    return now


def renders(stream: Stream, clock, steps: int = 100, **kwargs) -> int:
    """How many times the bar was drawn over ``steps`` steps of one second each."""
    for _ in progress_bar(range(steps), file=stream, **kwargs):
        clock[0] += 1.0
    return stream.getvalue().count("\r")


def test_piped_bar_draws_once_per_interval(clock):
    # start, t = 30, 60, 90 s, end: 100 one-second steps give 5 lines, not 100
    assert PIPED_INTERVAL == 30.0
    assert renders(Stream(terminal=False), clock) == 5


def test_terminal_bar_keeps_tqdm_defaults(clock):
    assert renders(Stream(terminal=True), clock) >= 100
    bar = progress_bar(range(3), file=Stream(terminal=True))
    assert (bar.mininterval, bar.maxinterval) == (0.1, 10.0)


def test_piped_bar_is_not_forced_by_the_monitor_interval():
    bar = progress_bar(range(3), file=Stream(terminal=False))
    # tqdm's monitor thread refreshes a bar silent for maxinterval (10 s by default)
    assert bar.mininterval == PIPED_INTERVAL and bar.maxinterval >= PIPED_INTERVAL


def test_stderr_decides_when_no_file_is_given(monkeypatch):
    monkeypatch.setattr("sys.stderr", Stream(terminal=False))
    assert progress_bar(range(3)).mininterval == PIPED_INTERVAL
    monkeypatch.setattr("sys.stderr", Stream(terminal=True))
    assert progress_bar(range(3)).mininterval == 0.1


def test_explicit_interval_wins_and_a_disabled_bar_still_iterates(clock):
    assert progress_bar(range(3), file=Stream(terminal=False), mininterval=1.0).mininterval == 1.0
    # start, t = 10, 20, ..., 100 s, close
    assert renders(Stream(terminal=False), clock, mininterval=10.0) == 12
    assert list(progress_bar(range(3), file=Stream(terminal=False), disable=True)) == [0, 1, 2]


def test_manual_updates_are_sparse_too(clock):
    stream = Stream(terminal=False)
    with progress_bar(total=100, file=stream) as bar:
        for _ in range(100):
            clock[0] += 1.0
            bar.update(1)
    assert stream.getvalue().count("\r") == 5


def test_a_status_beside_the_count_adds_no_lines_and_shows_the_current_count(clock):
    """show() each step (as training does with its loss) must not force a line per step on a
    pipe, and each line drawn must carry the count as it is then (tqdm's own set_postfix drew
    at once, with an iterated bar's count as of its last draw: 0/100 for the first 30 s)."""
    stream = Stream(terminal=False)
    bar = progress_bar(range(100), file=stream)
    for step in bar:
        clock[0] += 1.0
        show(bar, loss=f"{step:.3f}")
    lines = [line for line in stream.getvalue().split("\r") if line]
    assert len(lines) == 5
    assert "30/100" in lines[1] and "loss=29.000" in lines[1]   # drawn at t = 30 s
    assert "100/100" in lines[-1] and "loss=99.000" in lines[-1]
    stream = Stream(terminal=False)
    with progress_bar(total=4, file=stream) as bar:
        for step in range(4):
            show(bar, f"job {step}")
            bar.update(1)
    assert stream.getvalue().count("\r") == 2 and "job 3" in stream.getvalue().split("\r")[-1]
