"""Running the Lua scripts on a redis-py connection: EVALSHA, ACL refusals, the allow-oom choice.

Each script is run with EVALSHA through redis-py's ``Script``, which reloads it
when the server answers NOSCRIPT (after a restart or ``SCRIPT FLUSH``), so a
flushed script cache costs one extra round trip and nothing else. A refusal by
the ACL inside a script is raised as a NOPERM error that names the commands the
scripts need (:func:`permission_error`). The scripts that give back or only
delete carry the ``allow-oom`` flag where the server can compile it
(:class:`OomSafeScript`; why, in :mod:`django_rlock.core._protocol.lock`),
chosen once per script and client on its first load.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.commands.core import Script
from redis.exceptions import NoScriptError, ResponseError

from django_rlock.core._protocol.calls import ScriptCall
from django_rlock.core._protocol.refusals import OomSafeBase, raise_if_refused
from django_rlock.core._sync.wire import HeldClient


class LockScript(Script):
    """A :class:`Script` whose ACL refusals say what is missing (see :func:`permission_error`).

    On a thread's held connection (:class:`~django_rlock.core._sync.wire.HeldClient`)
    it runs by the lean command path; a NOSCRIPT reply there is answered by
    redis-py's path, which loads the script and runs it again.
    """

    def __call__(  # type: ignore[override]  # narrower than redis-py's: only lists are passed
        self, keys: list[Any] | None = None, args: list[Any] | None = None, client: Any = None
    ) -> Any:
        """Run the script (EVALSHA, loading it on NOSCRIPT)."""
        try:
            if isinstance(client, HeldClient):
                try:
                    return client.run_script(self.sha, keys or [], args or [])
                except NoScriptError:
                    pass  # loaded and run by redis-py's path, below
            return super().__call__(keys=keys or [], args=args or [], client=client)
        except ResponseError as error:
            raise_if_refused(error)
            raise


def run_packed(
    script: LockScript | OomSafeScript,
    client: HeldClient,
    packed: bytes,
    call: Callable[[], ScriptCall],
) -> Any:
    """Run ``script``'s call ``packed`` (with ``script.sha``) on a thread's held connection.

    The lean path of a lock's hot calls (:mod:`~django_rlock.core._sync.wire`),
    with the pre-encoded parts of :class:`~django_rlock.core._protocol.resp.Template`.
    A NOSCRIPT reply sends ``call()`` (the same call as keys and arguments) by
    redis-py's path, which loads the script (and picks the variant a server
    compiles); an ACL refusal says what is missing, as :class:`LockScript` does.
    """
    try:
        return client.run_packed(packed)
    except NoScriptError:
        made = call()
        return script(keys=made.keys, args=made.args, client=client)
    except ResponseError as error:
        raise_if_refused(error)
        raise


class OomSafeScript(OomSafeBase):
    """A script that runs under OOM where the server allows it (Redis >= 7).

    Tries the ``allow-oom`` variant; if the server cannot compile it, falls
    back to the plain one for good (:class:`OomFallback`). The choice costs
    one failed SCRIPT LOAD, once, on the first call.
    """

    def __init__(self, redis: Any, body: str) -> None:
        super().__init__(lambda text: LockScript(redis, text), body)

    def __call__(
        self, keys: list[Any] | None = None, args: list[Any] | None = None, client: Any = None
    ) -> Any:
        """Run the script as :class:`Script` does (EVALSHA, loading it on NOSCRIPT)."""
        flagged, script = self._choose()
        try:
            return script(keys=keys or [], args=args or [], client=client)
        except ResponseError as error:
            return self._after(flagged, error)(keys=keys or [], args=args or [], client=client)
