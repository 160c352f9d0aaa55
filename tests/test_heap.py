"""avex/heap.py: the commands' glibc heap setting, with a stand-in C library (the real one is
set only by the commands' own processes)."""
import os
import platform
import subprocess
import sys

import pytest

from avex import heap


class FakeLibc:
    def __init__(self, answer=1):
        self.calls, self.answer = [], answer

    def mallopt(self, param, value):
        self.calls.append((param, value))
        return self.answer


def test_sets_the_mmap_and_trim_thresholds(monkeypatch):
    monkeypatch.delenv(heap.ENV, raising=False)
    libc = FakeLibc()
    assert heap.keep_freed_memory(libc) is True
    assert libc.calls == [(heap.M_MMAP_THRESHOLD, 32 << 20), (heap.M_TRIM_THRESHOLD, 1 << 30)]


def test_a_refused_value_reports_not_set(monkeypatch):
    monkeypatch.delenv(heap.ENV, raising=False)
    assert heap.keep_freed_memory(FakeLibc(answer=0)) is False


def test_the_environment_turns_it_off(monkeypatch):
    monkeypatch.setenv(heap.ENV, "0")
    libc = FakeLibc()
    assert heap.keep_freed_memory(libc) is False and libc.calls == []


def test_a_c_library_without_mallopt_is_left_alone(monkeypatch):
    monkeypatch.delenv(heap.ENV, raising=False)
    assert heap.keep_freed_memory(object()) is False


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only; this C library is "
                    f"{platform.libc_ver()[0] or 'unknown'}")
def test_glibc_accepts_the_settings_in_a_fresh_process():
    code = "from avex.heap import keep_freed_memory; print(keep_freed_memory())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "True"


@pytest.mark.parametrize("value", ["false", "no", "2", ""])
def test_a_value_other_than_0_or_1_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv(heap.ENV, value)
    libc = FakeLibc()
    with pytest.raises(ValueError, match=rf"AVEX_KEEP_FREED_HEAP must be 0 .* or 1 .*, got {value!r}"):
        heap.keep_freed_memory(libc)
    assert libc.calls == []


@pytest.mark.parametrize("module", ["avex.train", "avex.evaluate"])
def test_the_commands_refuse_a_bad_value_before_any_work(module, tmp_path):
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                         text=True, cwd=tmp_path, env={**os.environ, heap.ENV: "yes"})
    assert out.returncode == 2 and out.stdout == ""
    assert f"python -m {module}: error: AVEX_KEEP_FREED_HEAP must be 0" in out.stderr
