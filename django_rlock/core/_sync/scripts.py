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
from redis.exceptions import NoPermissionError, NoScriptError, ResponseError

from django_rlock.core._protocol.calls import ScriptCall
from django_rlock.core._protocol.lock import ALLOW_OOM, SCRIPT_COMMANDS
from django_rlock.core._sync.wire import HeldClient

#: How servers word an ACL refusal inside a script: Redis ("... can't run this
#: command ...", "... can't access at least one of the keys ..."), Valkey 8.
_SCRIPT_ACL_REFUSALS = ("The user executing the script can't", "ACL failure in script")


def permission_error(error: ResponseError) -> NoPermissionError | None:
    """A clear NOPERM error for an ACL refusal inside a script, else None.

    A command refused inside a script comes back as a plain error: Redis names
    neither the command nor the cause ("The user executing the script can't run
    this command or subcommand"), Valkey names the command ("ACL failure in
    script: User u has no permissions to run the 'set' command"). The caller gets
    what to grant instead.
    """
    message = str(error)
    if not any(marker in message for marker in _SCRIPT_ACL_REFUSALS):
        return None
    return NoPermissionError(
        "NOPERM: the Redis ACL user may not run a command the lock scripts need "
        f"({message.strip()}). The scripts run: {' '.join(SCRIPT_COMMANDS)}; "
        "grant them with the lock key prefix and its channels "
        '(docs/acl-and-tls.md, "Minimal ACL").'
    )


def is_unsupported_shebang(error: ResponseError) -> bool:
    """Whether ``error`` is a server refusing to compile a ``#!lua flags=...`` script.

    Redis < 7 reads the shebang as Lua and fails to compile it; a server that
    knows shebangs but not the flag says so.
    """
    message = str(error).lower()
    return "compiling script" in message or "shebang" in message


class OomFallback:
    """Which variant of an ``allow-oom`` script to send, and when to fall back (no I/O).

    The flagged variant is sent until a server refuses to compile it; then
    the plain one, for good. The decision is made on the variant a call
    *sent*, not on the current choice: when many calls race the first load,
    each one refused for the flag retries with the plain variant, even if
    another has switched the choice meanwhile.
    """

    def __init__(self) -> None:
        #: True while the ``allow-oom`` variant is in use.
        self.flagged = True

    def retry_plain(self, sent_flagged: bool, error: ResponseError) -> bool:
        """Whether a call that sent the ``sent_flagged`` variant and got ``error`` resends plain."""
        if not sent_flagged or not is_unsupported_shebang(error):
            return False
        self.flagged = False
        return True


def raise_if_refused(error: ResponseError) -> None:
    """Raise the clear NOPERM error for an ACL refusal inside a script (from ``error``)."""
    refused = permission_error(error)
    if refused is not None:
        raise refused from error


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


class OomSafeBase:
    """What the sync and asyncio ``allow-oom`` scripts share: both variants and the policy."""

    def __init__(self, make: Callable[[str], Any], body: str) -> None:
        self._plain = make(body)
        self._variants = {True: make(ALLOW_OOM + body), False: self._plain}
        self._policy = OomFallback()

    @property
    def flagged(self) -> bool:
        """True while the ``allow-oom`` variant is in use."""
        return self._policy.flagged

    @property
    def sha(self) -> str:
        """The SHA of the variant in use (what a packed call names)."""
        return self._variants[self._policy.flagged].sha  # type: ignore[no-any-return]

    def _choose(self) -> tuple[bool, Any]:
        flagged = self._policy.flagged
        return flagged, self._variants[flagged]

    def _after(self, flagged: bool, error: ResponseError) -> Any:
        """The plain variant to resend a refused call with (or re-raise ``error``)."""
        if not self._policy.retry_plain(flagged, error):
            raise error
        return self._plain


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
