"""The guardian of an embedded redis-server: runs it, and stops it when nobody uses it.

Started by :class:`django_rlock.backends._embedded_server.EmbeddedServer` as
``python -I <this file> START_LOCK USERS_LOCK REDIS_SERVER CONFIG [DIRECTORY]``, in a
session of its own (so a Ctrl-C or the exit of the process that started it
does not stop a server other processes still use). Standard library only: it
runs by file path in an isolated interpreter, whatever ``sys.path`` its starter
had.

Every process using the server holds a shared ``flock`` on USERS_LOCK; the
kernel drops it when that process exits, however it exits. A few times a
second the guardian takes START_LOCK (which every process holds while it
joins or starts a server) and then tries USERS_LOCK exclusively: getting it
means nobody uses the server and nobody is joining it, so the guardian stops
the server while holding both, and only then lets go. It also stops the
server on SIGTERM, SIGINT and SIGHUP, and exits when the server dies. On
Linux the server gets SIGTERM if the guardian itself is killed.

With DIRECTORY (an ephemeral server), a server stopped because nobody uses it
leaves nothing behind: the guardian removes DIRECTORY, still holding both
locks. A server stopped any other way (a signal, a crash) keeps its directory,
where a process still using it may start the next one.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from types import FrameType

#: Seconds between two looks at the users' lock: how long an unused server lingers.
CHECK_INTERVAL = 0.25
#: Seconds a stopping redis-server has to save its data and exit before SIGKILL.
STOP_GRACE = 10.0
#: Seconds a stop asked by a signal waits for a process joining the server.
JOIN_GRACE = 30.0
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>

_stop_requested = False


def _request_stop(signum: int, frame: FrameType | None) -> None:
    global _stop_requested  # noqa: PLW0603 -- the signal handler's only way out
    _stop_requested = True


def _die_with_guardian() -> None:
    """In the server's process before exec: SIGTERM it when the guardian dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _lock_within(fd: int, seconds: float) -> None:
    """Take ``fd``'s lock, or go on without it after ``seconds`` (a stop must happen)."""
    deadline = time.monotonic() + seconds
    while not _try_lock(fd) and time.monotonic() < deadline:
        time.sleep(CHECK_INTERVAL / 10)


def _unused(start_fd: int, users_fd: int) -> bool:
    """True, holding both locks, when no process uses the server or is joining it."""
    if not _try_lock(start_fd):
        return False
    if _try_lock(users_fd):
        return True
    fcntl.flock(start_fd, fcntl.LOCK_UN)
    return False


def _stop(server: subprocess.Popen[bytes]) -> None:
    """SIGTERM (redis-server saves and removes its socket and pid file), then SIGKILL."""
    server.terminate()
    try:
        server.wait(STOP_GRACE)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def main(argv: list[str]) -> int:
    """Run the server of ``argv`` until it is unused, asked to stop, or dead."""
    start_lock, users_lock, redis_server, config, *ephemeral_directory = argv
    start_fd = os.open(start_lock, os.O_RDWR | os.O_CREAT, 0o600)
    users_fd = os.open(users_lock, os.O_RDWR | os.O_CREAT, 0o600)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _request_stop)
    server = subprocess.Popen(
        [redis_server, config],
        stdin=subprocess.DEVNULL,
        preexec_fn=_die_with_guardian if sys.platform == "linux" else None,  # noqa: PLW1509 -- the guardian runs no threads
    )
    while server.poll() is None:
        if _stop_requested:
            # Not while a process joins: it would find the socket, then lose it.
            _lock_within(start_fd, JOIN_GRACE)
            _stop(server)
            break
        if _unused(start_fd, users_fd):
            _stop(server)
            for directory in ephemeral_directory:
                shutil.rmtree(directory, ignore_errors=True)
            break
        time.sleep(CHECK_INTERVAL)
    # A server that died on its own leaves its socket and pid file: the next
    # process to start a server finds them dead (no PING answer) and replaces them.
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
