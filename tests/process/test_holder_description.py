"""The holder a grant describes: a thread's description, kept per thread, names its own process."""

from __future__ import annotations

import json
import os
import time

import pytest

from django_rlock.core._process.holder import describe

pytestmark = pytest.mark.pure


def test_a_forked_child_describes_itself_with_its_own_pid() -> None:
    # The thread keeps its description from call to call; a child forked by it
    # inherits that thread's copy, which names the parent.
    assert json.loads(describe())["pid"] == os.getpid()
    child = os.fork()
    if child == 0:  # the child: exit status 0 when its description names it
        code = 1
        try:
            code = 0 if json.loads(describe())["pid"] == os.getpid() else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0, "the child described its parent"
            return
        time.sleep(0.01)
    os.kill(child, 9)
    pytest.fail("the forked child did not finish")
