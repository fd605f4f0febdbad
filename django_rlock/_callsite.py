"""Where user code took a lock: the slow-lock log names it."""

from __future__ import annotations

import os
import sys
import sysconfig

# Frames from these directories are the machinery between the user's code and
# the lock (this library, its Celery face, the standard library's contextlib,
# threading, asyncio...); the location reported is the first frame outside them.
_SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MACHINERY = (
    os.path.join(_SOURCE_ROOT, "django_rlock") + os.sep,
    os.path.join(_SOURCE_ROOT, "celery_rlock") + os.sep,
    sysconfig.get_paths()["stdlib"] + os.sep,
)


# Source file -> whether it is machinery: asked on every grant (a leak report
# names the code that took the hold), so each file is judged once. Bounded by
# the source files the process runs.
_verdicts: dict[str, bool] = {}


def caller_location() -> str | None:
    """``path:line in function`` of the nearest caller outside the lock machinery."""
    frame = sys._getframe(1)
    verdicts = _verdicts
    while frame is not None:
        code = frame.f_code
        filename = code.co_filename
        machinery = verdicts.get(filename)
        if machinery is None:
            machinery = verdicts[filename] = filename.startswith(_MACHINERY)
        if not machinery:
            return f"{filename}:{frame.f_lineno} in {code.co_name}"
        frame = frame.f_back  # type: ignore[assignment]  # None ends the loop
    return None


def called_from_machinery(depth: int) -> bool:
    """Whether the caller ``depth`` frames above the one asking is this library's own code.

    ``depth`` 1 is the caller of the function that asks. Only django-rlock's and
    celery-rlock's own files count here: the package formatting or checking a
    name for the user.
    """
    filename = sys._getframe(depth + 1).f_code.co_filename
    return filename.startswith(_MACHINERY[:2])
