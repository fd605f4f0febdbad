"""How a server refuses a script, read from its reply, and the allow-oom choice: no I/O."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.exceptions import NoPermissionError, ResponseError

from django_rlock.core._protocol.lock import ALLOW_OOM, SCRIPT_COMMANDS

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
