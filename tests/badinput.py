"""The table format of the bad-input tests (tests/test_bad_input_*.py): one case a line.

``case(id, call, error, match)``: ``call()`` must raise ``error`` with a message matching
``match`` (a regex searched in the message).
``usage(id, main, argv, match)``: ``main(argv)`` must exit with status 2 (a usage error),
print a message matching ``match`` on stderr and no traceback.
``exact(id, call, expected)``: an edge input that is valid and was answered wrongly;
``call()`` must return ``expected`` exactly.
"""
import re

import pytest

NAN, INF = float("nan"), float("inf")


def case(case_id: str, call, error, match: str, marks=()):
    return pytest.param(call, error, match, id=case_id, marks=marks)


def usage(case_id: str, main, argv, match: str):
    return pytest.param(main, list(argv), match, id=case_id)


def exact(case_id: str, call, expected):
    return pytest.param(call, expected, id=case_id)


def raises(call, error, match):
    with pytest.raises(error, match=match):
        call()


def exits_with_usage_error(main, argv, match, capsys):
    """``main(argv)`` exits with status 2 (SystemExit(2), or a returned 2 that ``sys.exit``
    passes on), a message matching ``match`` on stderr and no traceback."""
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert re.search(match, err), err
    assert "Traceback" not in err
