"""Lock names, argument checks and the Redis key layout.

Every key and channel of one lock shares a single Redis Cluster hash slot. The
library owns the hash tag: the user's name is escaped so that it can never
contain ``{`` or ``}``, then wrapped in braces. ``%`` is escaped first, which
keeps the escaping one-to-one (two different names never share keys)::

    <prefix>:{<escaped name>}           HASH     owner id -> hold count; '~t' the grant's
                                                 fencing token, '~r' the holder's last
                                                 request id, '~holder', '~task', '~since'
    <prefix>:{<escaped name>}:waiters   ZSET     waiter id -> expiry (ms): who to wake next
    <prefix>:{<escaped name>}:released  CHANNEL  a message on every full release
    <prefix>:{<escaped name>}:released:@<wake name>  CHANNEL  a release naming its waiter
    <prefix>:{<escaped name>}:req       HASH     after a final release, for a minute: the
                                                 releasing owner -> its request id, and
                                                 '~t' the last token (lost replies, fencing)

The sibling kinds keep a fencing counter ``<hash>:fence`` (STRING) and a
request latch per owner ``<hash>:req:<owner>`` (STRING) instead (see each
kind's module).

A name is at most :data:`MAX_NAME_BYTES` long. A name built from a call's
arguments (``@locked``, Celery's task keys) may be longer: :func:`fit_name`
turns it into its readable head, :data:`DIGEST_SEPARATOR` and the SHA-256 of
the whole (a :class:`DigestName`). That separator is a control character,
which :func:`check_name` refuses in any other name, so the digest form of a
long name can never equal a name a caller passes: two different names never
share a key.
"""

from __future__ import annotations

import hashlib
import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Self

from django_rlock.core.defaults import MIN_WATCHDOG_TIMEOUT, renewal_socket_timeout
from django_rlock.core.exceptions import InvalidLockNameError

MAX_NAME_BYTES = 1024


#: Between a long name's head and its digest (see :func:`fit_name`). Unit
#: Separator, a control character: no name a caller passes may contain it.
DIGEST_SEPARATOR = "\x1f"


#: How much of a long name its digest form keeps, to stay readable in listings.
DIGEST_HEAD_CHARS = 200


_DIGEST_TAIL = re.compile(f"{DIGEST_SEPARATOR}sha256:[0-9a-f]{{64}}\\Z")


#: The longest lease or watchdog timeout, in seconds (about 31 years). Redis
#: takes expiries as integers, and Lua hands numbers to Redis with 14
#: significant digits: a longer expiry would reach Redis as ``1e+14`` and be
#: refused as "not an integer".
MAX_SECONDS = 1e9


_ESCAPES = (("%", "%25"), ("{", "%7B"), ("}", "%7D"))


def escape(name: str) -> str:
    """Make ``name`` safe inside a hash tag (no braces), reversibly."""
    for raw, escaped in _ESCAPES:
        name = name.replace(raw, escaped)
    return name


def unescape(escaped: str) -> str:
    """Invert :func:`escape`."""
    for raw, code in reversed(_ESCAPES):
        escaped = escaped.replace(code, raw)
    return escaped


def _control_character(text: str) -> str | None:
    for char in text:
        if unicodedata.category(char) == "Cc":
            return char
    return None


class DigestName(str):
    """The digest form of a name longer than :data:`MAX_NAME_BYTES` (see :func:`fit_name`).

    Only :func:`fit_name` and :meth:`LockKeys.name_of` make one. It is the one
    kind of name :func:`check_name` lets carry :data:`DIGEST_SEPARATOR`: the
    same text as a plain ``str`` is refused, so no caller can pass it.
    """

    __slots__ = ()


def _check_text(name: object) -> str:
    """The rules every name follows, whatever its length."""
    if not isinstance(name, str):
        raise InvalidLockNameError(f"lock name must be a str, not {type(name).__name__}")
    if not name:
        raise InvalidLockNameError("lock name must not be empty")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidLockNameError(
            "lock name must be encodable as UTF-8 (no lone surrogates)"
        ) from None
    # The separator of a digest form is the one control character allowed, there only.
    text = name.replace(DIGEST_SEPARATOR, "", 1) if isinstance(name, DigestName) else name
    control = _control_character(text)
    if control is not None and _DIGEST_TAIL.search(text):
        raise InvalidLockNameError(
            f"lock name {name!r} has the digest form of a name longer than {MAX_NAME_BYTES} "
            "bytes, which only the library makes: it cannot be passed as a name"
        )
    if control is not None:
        raise InvalidLockNameError(
            f"lock name must not contain control characters, found {control!r} in {name!r}"
        )
    return name


#: How many names :func:`check_name` and :meth:`LockKeys.build` remember per
#: process. The Django face makes a lock object per ``with rlock(...)`` block,
#: so the same names are checked and their keys built again and again; past
#: this many the memory is emptied and refilled by the names in use.
NAMES_KEPT = 4096

# Plain ``str`` names found usable. A DigestName is never kept: its text as a
# plain ``str`` must still be refused, and a dict cannot tell the two apart.
_usable: dict[str, None] = {}


def check_name(name: object) -> str:
    """Return ``name`` if it is a usable lock name, else raise :class:`InvalidLockNameError`.

    The error (a ``ValueError``) names the rule broken.
    """
    if type(name) is str and name in _usable:
        return name
    checked = _check_text(name)
    size = len(checked.encode("utf-8"))
    if size > MAX_NAME_BYTES:
        raise InvalidLockNameError(
            f"lock name must be at most {MAX_NAME_BYTES} UTF-8 bytes, got {size}"
        )
    if type(checked) is str:
        if len(_usable) >= NAMES_KEPT:
            _usable.clear()
        _usable[checked] = None
    return checked


def fit_name(name: object) -> str:
    """``name`` checked, or if longer than :data:`MAX_NAME_BYTES`, its :class:`DigestName`.

    For names built from a call's arguments (``@locked``, Celery's task keys),
    whose length the caller does not choose. A long name is never truncated
    (two long names must not collide): it becomes its first
    :data:`DIGEST_HEAD_CHARS` characters, :data:`DIGEST_SEPARATOR`, and
    ``sha256:`` with the hex digest of the whole name. Every other rule of
    :func:`check_name` applies to the whole name.
    """
    if type(name) is str and name in _usable:
        return name  # checked before, and short enough
    checked = _check_text(name)
    encoded = checked.encode("utf-8")
    if len(encoded) <= MAX_NAME_BYTES:
        return checked
    digest = hashlib.sha256(encoded).hexdigest()
    return DigestName(f"{checked[:DIGEST_HEAD_CHARS]}{DIGEST_SEPARATOR}sha256:{digest}")


def check_key_prefix(prefix: object) -> str:
    """Return ``prefix`` if keys can be namespaced by it, else raise ValueError."""
    if not isinstance(prefix, str):
        raise ValueError(f"key_prefix must be a str, not {type(prefix).__name__}")
    if "{" in prefix or "}" in prefix:
        raise ValueError(
            f"key_prefix must not contain '{{' or '}}' (the library owns the hash tag): {prefix!r}"
        )
    if _control_character(prefix) is not None:
        raise ValueError(f"key_prefix must not contain control characters: {prefix!r}")
    return prefix


def _seconds(value: object, what: str) -> float:
    # bool is an int subclass; True seconds is always a mistake.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite, got {value!r}")
    return float(value)


def check_timeout(timeout: object) -> float | None:
    """``timeout``: None (wait forever) or seconds >= 0."""
    if timeout is None:
        return None
    seconds = _seconds(timeout, "timeout")
    if seconds < 0:
        raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
    return seconds


def check_lease(lease: object) -> float | None:
    """``lease``: None (watchdog) or seconds > 0."""
    if lease is None:
        return None
    seconds = _seconds(lease, "lease")
    if seconds <= 0:
        raise ValueError(f"lease must be > 0 seconds or None (watchdog), got {lease!r}")
    if seconds > MAX_SECONDS:
        raise ValueError(f"lease must be at most {MAX_SECONDS:g} seconds, got {lease!r}")
    return seconds


def check_max_hold(max_hold: object) -> float | None:
    """``max_hold``: None (no bound) or seconds > 0 a watchdog hold may last."""
    if max_hold is None:
        return None
    seconds = _seconds(max_hold, "max_hold")
    if seconds <= 0:
        raise ValueError(f"max_hold must be > 0 seconds or None (no bound), got {max_hold!r}")
    return seconds


def check_watchdog_timeout(timeout: object) -> float:
    """``watchdog_timeout``: seconds, at least :data:`MIN_WATCHDOG_TIMEOUT`."""
    seconds = _seconds(timeout, "watchdog_timeout")
    if seconds <= 0:
        raise ValueError(f"watchdog_timeout must be > 0 seconds, got {timeout!r}")
    if seconds < MIN_WATCHDOG_TIMEOUT:
        raise ValueError(
            f"watchdog_timeout must be at least {MIN_WATCHDOG_TIMEOUT:g} seconds, got {timeout!r}: "
            f"renewals run every timeout/3, each bounded by timeout/6 "
            f"({renewal_socket_timeout(seconds) * 1000:.0f} ms here), too little to renew reliably"
        )
    if seconds > MAX_SECONDS:
        raise ValueError(
            f"watchdog_timeout must be at most {MAX_SECONDS:g} seconds, got {timeout!r}"
        )
    return seconds


def milliseconds(seconds: float) -> int:
    """Seconds as the whole milliseconds Redis takes, rounded up, at least 1."""
    return max(1, math.ceil(seconds * 1000))


@dataclass(frozen=True, slots=True)
class LockKeys:
    """The Redis keys and channel of one lock name."""

    name: str
    hash: str
    fence: str
    waiters: str
    channel: str

    @classmethod
    def build(cls, prefix: str, name: str) -> LockKeys:
        """Derive the keys of ``name`` under ``prefix`` (both already checked).

        Built once per prefix and plain ``str`` name (see :data:`NAMES_KEPT`):
        the keys are a value, shared by every lock object of the name.
        """
        plain = type(name) is str
        if plain:
            known = _built.get((cls, prefix, name))
            if known is not None:
                return known
        base = f"{prefix}:{{{escape(name)}}}" if prefix else f"{{{escape(name)}}}"
        keys = cls.around(name, base)
        if plain:
            if len(_built) >= NAMES_KEPT:
                _built.clear()
            _built[(cls, prefix, name)] = keys
        return keys

    @classmethod
    def around(cls, name: str, hash_key: str) -> Self:
        """The keys of ``name`` whose hash is ``hash_key``; the others are named after it.

        The lock kinds put their hash under the lock's (``<lock hash>:fair``,
        ``...:sem``), so all of a name's keys keep its hash tag, hence its slot.
        """
        return cls(
            name=name,
            hash=hash_key,
            fence=f"{hash_key}:fence",
            waiters=f"{hash_key}:waiters",
            channel=f"{hash_key}:released",
        )

    def latch(self, owner: str) -> str:
        """The request latch of ``owner`` on this lock (see :mod:`~.lock`)."""
        return f"{self.hash}:req:{owner}"

    @property
    def latches(self) -> str:
        """The plain lock's final releases, kept a while after them (see :mod:`~.lock`).

        One hash per name: each releasing owner's request id, and the last token.
        """
        return f"{self.hash}:req"

    @staticmethod
    def name_of(prefix: str, hash_key: str) -> str | None:
        """The lock name of a lock hash key under ``prefix``, or None if it is not one."""
        head = f"{prefix}:{{" if prefix else "{"
        if not (hash_key.startswith(head) and hash_key.endswith("}")):
            return None
        inner = hash_key[len(head) : -1]
        if "{" in inner or "}" in inner:
            return None
        name = unescape(inner)
        if _DIGEST_TAIL.search(name):
            # Made by fit_name: a name the caller can use to inspect or release it.
            return DigestName(name)
        return name


# (kind, prefix, name) -> the keys of a plain ``str`` name (see :meth:`LockKeys.build`).
_built: dict[tuple[type[LockKeys], str, str], LockKeys] = {}
