"""Units of work: the scopes a framework announces, and the holds taken in each.

A request (Django's ``request_started`` / ``request_finished``) or a Celery
task run (``task_prerun`` / ``task_postrun``) is a unit of work whose holds
end with it. The framework says when it begins and ends (:func:`begin`,
:func:`end`); every hold granted in between, on whatever thread or task the
unit's code runs, is recorded in the unit's :class:`Scope`
(:meth:`~django_rlock.core._protocol.holds.HoldRegistry.grant` calls
:func:`current`). Nothing is inferred: a scope ends when its framework says
so, and only then (:mod:`django_rlock.core._process.leaks` settles its holds).

Which scope a grant belongs to is found, in order:

1. a context variable set by :func:`begin`. A WSGI request, a Celery task run
   and Django's test client send their signals in the context of the code
   they frame, so the variable is seen by that code, and by code it runs in a
   copy of its context: ``asyncio.to_thread``, ``sync_to_async`` (both kinds),
   tasks it creates;
2. under ASGI, the request's asgiref ``ThreadSensitiveContext``. Django sends
   an ASGI request's signals from tasks of their own (``Signal.asend`` runs
   its receivers under ``asyncio.gather``), so a variable they set is not seen
   by the view; asgiref's per-request context object is, by the view's task,
   its thread-sensitive thread, and ``sync_to_async(thread_sensitive=False)``
   executor threads alike. :func:`begin` files the scope under it.

Scopes nest (an eager Celery task inside a request): a grant belongs to the
innermost scope under way.
"""

from __future__ import annotations

import contextvars
import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django_rlock.core._process import forking

if TYPE_CHECKING:
    from django_rlock.core._protocol.holds import Hold


@dataclass(eq=False)
class Scope:
    """One unit of work under way: what it is, and the holds granted in it."""

    #: What it is, for reports: "request", "task run".
    what: str
    #: The scope it began inside, if any (it goes on after this one ends).
    parent: Scope | None = None
    #: Holds granted while this scope was the innermost one and not given
    #: back yet (a dict as an ordered set: the registry drops a hold as it is
    #: released, so a long task run that locks a million times keeps none).
    #: Re-entries are not counted: a hold belongs to the scope that first took it.
    holds: dict[Hold, None] = field(default_factory=dict)
    ended: bool = False


_current: contextvars.ContextVar[Scope | None] = contextvars.ContextVar(
    "django_rlock_scope", default=None
)

# asgiref's per-request ThreadSensitiveContext -> the innermost scope begun under it.
_by_asgi_context: weakref.WeakKeyDictionary[Any, Scope] = weakref.WeakKeyDictionary()
_by_asgi_context_lock = threading.Lock()


def _asgi_context() -> Any:
    """The running ASGI request's asgiref ThreadSensitiveContext, or None.

    Read only when asgiref is imported already (Django imports it): the core
    never imports it itself.
    """
    import sys  # noqa: PLC0415 -- looked up only off the common path

    sync = sys.modules.get("asgiref.sync")
    if sync is None:
        return None
    variable = getattr(getattr(sync, "SyncToAsync", None), "thread_sensitive_context", None)
    if variable is None:
        return None
    return variable.get(None)


def current() -> Scope | None:
    """The innermost unit of work under way for the calling code, or None."""
    scope = _current.get()
    if scope is None and _by_asgi_context:
        context = _asgi_context()
        if context is not None:
            with _by_asgi_context_lock:
                scope = _by_asgi_context.get(context)
    # A copy of a context made while a scope was under way outlives its end
    # (a thread the unit started and did not join): what it does now is the
    # enclosing unit's.
    while scope is not None and scope.ended:
        scope = scope.parent
    return scope


def begin(what: str) -> Scope:
    """A unit of work begins in the calling code's context: holds granted from now are its."""
    scope = Scope(what, parent=current())
    _current.set(scope)
    context = _asgi_context()
    if context is not None:
        with _by_asgi_context_lock:
            _by_asgi_context[context] = scope
    return scope


def end() -> Scope | None:
    """The innermost unit of work under way has ended: it, or None if none was begun."""
    scope = current()
    if scope is None:
        return None
    scope.ended = True
    _current.set(scope.parent)
    context = _asgi_context()
    if context is not None:
        with _by_asgi_context_lock:
            if _by_asgi_context.get(context) is scope:
                if scope.parent is None:
                    del _by_asgi_context[context]
                else:
                    _by_asgi_context[context] = scope.parent
    return scope


@forking.after_fork_in_child
def _reset_after_fork() -> None:
    global _by_asgi_context_lock  # noqa: PLW0603 -- a mutex held across fork stays held
    _by_asgi_context_lock = threading.Lock()
