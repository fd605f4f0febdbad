"""Helper processes of the tests: a Python module run as a child, never outliving its block."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

#: Seconds a killed child may take to be reaped: only reached when something hangs.
REAP = 10.0


@contextmanager
def child(
    command: list[str],
    *,
    stdin: bool = False,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[subprocess.Popen[str]]:
    """``command`` with its output piped as text (and its input, if ``stdin``).

    On leaving the block the child is killed if it still runs, reaped, and its
    pipes closed: a failing test leaves no process behind.
    """
    process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=env,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=REAP)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()


def python_module(
    module: str,
    *args: str,
    stdin: bool = False,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> AbstractContextManager[subprocess.Popen[str]]:
    """``python -m module args`` run as a :func:`child`."""
    return child([sys.executable, "-m", module, *args], stdin=stdin, cwd=cwd, env=env)


def read_answer(process: subprocess.Popen[str]) -> dict[str, Any]:
    """The next line the child printed, a JSON object (fails the test if it ended silent)."""
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, "the holder process ended without answering"
    answer: dict[str, Any] = json.loads(line)
    return answer
