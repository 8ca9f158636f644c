"""The helper that starts the tests' processes of their own (tests.fixtures.preloaded):
each is another process, on one thread, with its own environment, output and exit status."""

from __future__ import annotations

import os
import time

import pytest

from tests.fixtures.preloaded import Child

pytestmark = pytest.mark.slow  # the first child starts the server: 8-10 s of imports


def test_a_child_is_its_own_process_on_one_thread_with_its_exit_status():
    first = Child("tests/fixtures/child_report.py", ["3"], {"CHILD_REPORT": "first"})
    second = Child("tests/fixtures/child_report.py", ["0"])
    assert first.wait(timeout=120) == 3 and second.wait(timeout=120) == 0
    pid, threads, seen = first.stdout().split()
    assert int(pid) not in (os.getpid(), int(second.stdout().split()[0]))
    assert threads == "1" and seen == "first"
    # One child's environment is not the next one's.
    assert second.stdout().split()[1:] == ["1"]
    assert first.stderr() == "to stderr\n"


def test_a_killed_child_reports_the_signal():
    child = Child("tests/fixtures/child_report.py", ["sleep"])
    deadline = time.monotonic() + 60
    while not child.stdout() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert child.stdout() and child.poll() is None  # started, and sleeping
    child.kill()
    assert child.wait(timeout=60) == -9
    # A child still running after wait's timeout is killed, as subprocess.run kills it.
    late = Child("tests/fixtures/child_report.py", ["sleep"])
    assert late.wait(timeout=0.5) is None and late.poll() == -9
