"""RESP packing for the lock scripts' calls: bytes out, no socket (shared by both engines).

The engines' lean command path (``_sync/wire.py``; the asyncio engine may use
the same functions) writes each script call as one ``bytes`` object packed
here, in one ``sendall``, instead of going through redis-py's command path.
Packing is what redis-py's ``Connection.pack_command`` does, minus its
generality: an EVALSHA's parts are strings and integers, and most of them
repeat from call to call (the script's SHA, the lock's keys, the owner id, the
holder description, ``publish``), so their encoded form is remembered
(:func:`evalsha`, bounded) and only what changes per call (the request id,
a waiter's sleep) is encoded each time.

RESP2 and RESP3 frame a command the same way (an array of bulk strings), so
one packing serves both. Strings are encoded as UTF-8, as redis-py's default
encoder does; ``bytes`` go as they are.

This API is kept stable for both engines: :func:`bulk`, :func:`command`,
:func:`evalsha`, :class:`Template`, :func:`encoded`.
"""

from __future__ import annotations

from collections.abc import Sequence

#: A part of a command: text (UTF-8), raw bytes, an integer (its decimal form) or a
#: float (its ``repr``, as redis-py sends it).
Part = str | bytes | int | float


def bulk(value: Part) -> bytes:
    r"""One RESP bulk string: ``$<length>\r\n<data>\r\n``."""
    if isinstance(value, str):
        data = value.encode()
    elif isinstance(value, bytes):
        data = value
    elif isinstance(value, int) and not isinstance(value, bool):
        data = b"%d" % value
    elif isinstance(value, float):
        data = repr(value).encode()
    else:
        raise TypeError(
            f"a command part must be str, bytes, int or float, not {type(value).__name__}"
        )
    return b"$%d\r\n%s\r\n" % (len(data), data)


def command(*parts: Part) -> bytes:
    """A whole command (``command("GET", "k")``), as one bytes object."""
    return b"*%d\r\n" % len(parts) + b"".join(bulk(part) for part in parts)


#: How many encoded strings (and integers) :func:`evalsha` remembers before it starts afresh.
MEMO_LIMIT = 4096


# str -> its bulk string, and int -> its bulk string: the keys, owner ids,
# SHAs, descriptions, 'publish', expiries. Kept apart by type, since 1, 1.0,
# and True are one dict key but not one encoding. Request ids pass too:
# a new one per call costs a dict insert, and the bound clears them out.
_memo: dict[str, bytes] = {}
_ints: dict[int, bytes] = {}


def _remember(value: str) -> bytes:
    encoded = bulk(value)
    if len(_memo) >= MEMO_LIMIT:
        _memo.clear()  # many lock names or request ids: keep the recent ones
    _memo[value] = encoded
    return encoded


def _remember_int(value: int) -> bytes:
    encoded = bulk(value)
    if len(_ints) >= MEMO_LIMIT:
        _ints.clear()
    _ints[value] = encoded
    return encoded


_EVALSHA = b"$7\r\nEVALSHA\r\n"


def evalsha(
    sha: str, keys: Sequence[Part], args: Sequence[Part], fresh: Part | None = None
) -> bytes:
    """``EVALSHA sha len(keys) *keys *args`` as one bytes object.

    Every str and int part is encoded once and then reused (see the module's
    docstring), but ``fresh`` (the call's request id, if the caller knows it:
    never worth keeping). Thread-safe (dict operations only), bounded by
    :data:`MEMO_LIMIT`.
    """
    memo, ints = _memo, _ints
    parts = [b"*%d\r\n" % (3 + len(keys) + len(args)), _EVALSHA]
    append = parts.append
    append(memo.get(sha) or _remember(sha))
    count = len(keys)
    append(ints.get(count) or _remember_int(count))
    for part in (*keys, *args):
        kind = type(part)
        if kind is str and part is not fresh:
            append(memo.get(part) or _remember(part))  # type: ignore[arg-type]
        elif kind is int:
            append(ints.get(part) or _remember_int(part))  # type: ignore[arg-type]
        else:
            append(bulk(part))
    return b"".join(parts)


class Template:
    """EVALSHA calls whose keys and first arguments are fixed, encoded once.

    ``Template(keys, fixed, rest)`` packs ``EVALSHA sha len(keys) *keys
    *fixed *rest_values`` with :meth:`pack`, where ``rest`` is how many
    arguments each call adds. A lock keeps one per owner for its hot calls:
    packing one is a join of a few bytes objects.
    """

    __slots__ = ("_body", "_head")

    def __init__(self, keys: Sequence[Part], fixed: Sequence[Part], rest: int) -> None:
        self._head = b"*%d\r\n" % (3 + len(keys) + len(fixed) + rest) + _EVALSHA
        self._body = bulk(len(keys)) + b"".join(bulk(part) for part in (*keys, *fixed))

    def pack(self, sha: str, *rest: Part, fresh: Part | None = None) -> bytes:
        """One call of the script ``sha`` with the remaining arguments ``rest``.

        ``fresh``: the one argument new on every call (a request id), not remembered.
        """
        memo, ints = _memo, _ints
        parts = [self._head, memo.get(sha) or _remember(sha), self._body]
        append = parts.append
        for part in rest:
            kind = type(part)
            if kind is str and part is not fresh:
                append(memo.get(part) or _remember(part))  # type: ignore[arg-type]
            elif kind is int:
                append(ints.get(part) or _remember_int(part))  # type: ignore[arg-type]
            else:
                append(bulk(part))
        return b"".join(parts)

    def pack_fresh(self, sha: str, before: bytes, fresh: str, after: bytes) -> bytes:
        """One call whose remaining arguments are ``before``, ``fresh`` and ``after``.

        ``before`` and ``after`` are arguments already encoded (:func:`encoded`,
        kept by the caller: an uncontended acquire's are the same on every
        call); ``fresh`` is the one new on every call (a request id). The same
        bytes as :meth:`pack` with those arguments, for a few joins less.
        """
        data = fresh.encode()
        return b"".join(
            (
                self._head,
                _memo.get(sha) or _remember(sha),
                self._body,
                before,
                b"$%d\r\n%s\r\n" % (len(data), data),
                after,
            )
        )


def encoded(*parts: Part) -> bytes:
    """``parts`` as consecutive bulk strings: arguments a :meth:`Template.pack_fresh` call takes."""
    return b"".join(bulk(part) for part in parts)
