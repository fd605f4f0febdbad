"""Lock names built from a function's call: shared by ``django_rlock.locked`` and Celery.

A key template is either a ``str.format`` template whose fields name the
function's parameters (``"order:{order_id}"``, ``"user:{request.user.pk}"``),
or a callable taking the same arguments as the function. Arguments are bound
with :func:`inspect.signature` and defaults applied, so ``f(1)`` and
``f(order_id=1)`` lock the same name. Django-free.

``rlock(template, **fields)`` formats its name the same way
(:func:`format_name`), and a name given without fields that still holds a
bare ``{field}`` (a forgotten ``f`` prefix: every call would share one
literal name) is warned about once (:func:`warn_unformatted`).
"""

from __future__ import annotations

import inspect
import re
import string
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Final

from django_rlock._callsite import called_from_machinery
from django_rlock.core._faces import fit_name

#: A format string naming the function's parameters, or a callable with its signature.
KeyTemplate = str | Callable[..., str]


def _field_roots(template: str) -> list[str]:
    """The root of each field of ``template`` (``order`` of ``{order.pk}``), in order.

    Parsed once per template (``rlock("order:{order_id}", order_id=...)`` asks
    on every block); a template that does not parse raises ValueError each time.
    """
    roots = _roots.get(template)
    if roots is None:
        roots = []
        for _, field, _, _ in string.Formatter().parse(template):
            if field is None:
                continue
            root = field.split(".", 1)[0].split("[", 1)[0]
            roots.append(root)
        if len(_roots) >= TEMPLATES_KEPT:
            _roots.clear()
        _roots[template] = roots
    return list(roots)


#: How many templates' field roots are kept (past it they are parsed anew).
TEMPLATES_KEPT = 1024

_roots: dict[str, list[str]] = {}


def check_template(template: object, func: Callable[..., Any]) -> KeyTemplate:
    """Check ``template`` against ``func``'s signature at decoration time.

    Raises ValueError when a field is positional (``{}``, ``{0}``) or names a
    parameter ``func`` does not have (unless ``func`` takes ``**kwargs``).
    """
    if callable(template):
        return template
    if not isinstance(template, str) or not template:
        raise ValueError(
            f"lock key template must be a non-empty str or a callable, got {template!r}"
        )
    try:
        roots = _field_roots(template)
    except ValueError as error:
        raise ValueError(
            f"lock key template {template!r} is not a format string: {error}"
        ) from None
    parameters = inspect.signature(func).parameters
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    for root in roots:
        if not root or root.isdigit():
            raise ValueError(
                f"lock key template {template!r} must name its fields after parameters of "
                f"{func.__qualname__}, not by position"
            )
        if root not in parameters and not takes_kwargs:
            raise ValueError(
                f"lock key template {template!r} uses {{{root}}}, but {func.__qualname__}"
                f"{inspect.signature(func)} has no parameter {root!r}"
            )
    return template


def template_label(template: KeyTemplate) -> str:
    """A name for ``template`` that does not change from call to call (a metrics label).

    The template itself for a format string (``"order:{order_id}"``); for a
    callable, where it is defined (``module.qualname``).
    """
    if isinstance(template, str):
        return template
    target: Any = getattr(template, "__func__", template)
    module = getattr(target, "__module__", None) or "?"
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}.{qualname}"


def build_key(
    template: KeyTemplate, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> str:
    """The lock name for one call of ``func``.

    Raises TypeError when the arguments do not fit ``func`` (as the call itself
    would), ValueError when the template cannot format them, and
    :class:`~django_rlock.core.exceptions.InvalidLockNameError` (a ValueError)
    when the name built breaks a naming rule (a control character from a URL
    slug...). A name longer than the longest lock name is hashed, never
    truncated, into a form no caller can pass (see
    :func:`~django_rlock.core._protocol.names.fit_name`).
    """
    if callable(template):
        key = template(*args, **kwargs)
        if not isinstance(key, str):
            raise ValueError(f"lock key callable {template!r} returned {key!r}, not a str")
    else:
        arguments = _binder(func).arguments(args, kwargs)
        try:
            key = template.format_map(arguments)  # as format(**arguments), with no copy
        except (KeyError, AttributeError, IndexError, TypeError, ValueError) as error:
            raise ValueError(
                f"cannot build lock key from {template!r} for {func.__qualname__}: "
                f"{type(error).__name__}: {error}"
            ) from None
    return fit_name(key)


_POSITIONAL_OR_KEYWORD = inspect.Parameter.POSITIONAL_OR_KEYWORD
_KEYWORD_ONLY = inspect.Parameter.KEYWORD_ONLY
_VAR_KEYWORD = inspect.Parameter.VAR_KEYWORD


class _Binder:
    """How the arguments of one function's calls bind to its parameters, worked out once.

    :func:`build_key` runs for every call of a decorated function; reading the
    signature (``inspect.signature``) and binding through it cost more than the
    rest of a lock's bookkeeping. A signature of plain parameters (neither
    ``*args``, ``**kwargs`` nor positional-only) whose call fits it is bound
    here directly; any other call goes through :meth:`inspect.Signature.bind`,
    which raises the TypeError the call itself would.
    """

    __slots__ = (
        "defaults",
        "every_positional",
        "names",
        "positional",
        "required",
        "signature",
        "simple",
        "spread",
    )

    def __init__(self, func: Callable[..., Any]) -> None:
        self.signature = inspect.signature(func)
        parameters = list(self.signature.parameters.values())
        #: Every parameter is positional-or-keyword or keyword-only.
        self.simple = all(p.kind in (_POSITIONAL_OR_KEYWORD, _KEYWORD_ONLY) for p in parameters)
        self.positional = tuple(p.name for p in parameters if p.kind is _POSITIONAL_OR_KEYWORD)
        #: The number of parameters, when every one is positional-or-keyword (else -1):
        #: a call giving that many arguments by position, and no keyword, fills each once.
        self.every_positional = (
            len(parameters) if all(p.kind is _POSITIONAL_OR_KEYWORD for p in parameters) else -1
        )
        self.names = frozenset(p.name for p in parameters)
        self.required = frozenset(p.name for p in parameters if p.default is p.empty)
        self.defaults = {p.name: p.default for p in parameters if p.default is not p.empty}
        #: The ``**kwargs`` parameters, whose items the template sees as fields.
        self.spread = [p.name for p in parameters if p.kind is _VAR_KEYWORD]

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments by parameter name, defaults applied, ``**kwargs`` flattened."""
        if not kwargs and len(args) == self.every_positional:
            return dict(zip(self.positional, args, strict=True))  # what the loop below gives
        if self.simple and len(args) <= len(self.positional):
            arguments = dict(zip(self.positional, args, strict=False))
            names = self.names
            fits = True
            for name, value in kwargs.items():
                if name not in names or name in arguments:
                    fits = False  # unknown, or given twice: bind() says so
                    break
                arguments[name] = value
            if fits:
                for name, default in self.defaults.items():
                    arguments.setdefault(name, default)
                if self.required <= arguments.keys():
                    return arguments
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        for name in self.spread:
            arguments.update(arguments.pop(name, {}))
        return arguments


#: How many functions' binders are kept (past it they are made anew): the
#: decorated functions and tasks of a process, each one entry.
BINDERS_KEPT = 1024

_binders: dict[Callable[..., Any], _Binder] = {}


def _binder(func: Callable[..., Any]) -> _Binder:
    """``func``'s :class:`_Binder`, made on its first call."""
    try:
        binder = _binders.get(func)
    except TypeError:  # an unhashable callable: bound afresh each time
        return _Binder(func)
    if binder is None:
        if len(_binders) >= BINDERS_KEPT:
            _binders.clear()
        binder = _binders[func] = _Binder(func)
    return binder


class UnformattedNameWarning(RuntimeWarning):
    """A lock name given without fields holds a ``{field}`` nothing filled in.

    ``rlock("order:{order_id}")`` with the ``f`` forgotten locks the literal
    name: every order would share one lock. A RuntimeWarning, as Django's own
    run-time traps (``UnorderedObjectListWarning``) are, so
    ``-W error::RuntimeWarning`` and pytest's ``filterwarnings = error`` make it
    fail a test.
    """


# A ``str.format`` replacement field whose root is an identifier: ``{order_id}``,
# ``{request.user.pk}``, ``{row[id]}``, ``{n!r}``, ``{n:05d}``. ``{42}`` and
# ``{user-1}`` are not fields a template could mean (positional or not a name).
_BARE_FIELD: Final = re.compile(
    r"\{(?P<root>[^\W\d]\w*)(?:\.[^\W\d]\w*|\[[^\[\]{}]*\])*(?:![rsa])?(?::[^{}]*)?\}"
)

#: How many names :func:`warn_unformatted` remembers having warned about; past
#: it each new name is still warned about (once per call site, by ``warnings``).
WARNED_NAMES_KEPT: Final = 4096

_warned: set[str] = set()
_warned_lock = threading.Lock()


def unformatted_fields(name: str) -> list[str]:
    """The bare ``{field}`` roots of ``name`` a template would format, hash tags aside.

    A brace group that opens the name and has more after it (``{tenant}:orders``,
    Redis's own ``{user1000}.following``) is the Redis Cluster hash-tag form,
    written on purpose: it is not counted.
    """
    fields = []
    for match in _BARE_FIELD.finditer(name):
        if match.start() == 0 and match.end() < len(name):
            continue  # a hash tag opening the name
        root = match.group("root")
        if root not in fields:
            fields.append(root)
    return fields


def warn_unformatted(name: object, *, stacklevel: int) -> None:
    """Warn once per name when ``name`` holds a bare ``{field}`` (see :func:`unformatted_fields`).

    ``stacklevel`` is what the caller would give :func:`warnings.warn` itself
    (2: the warning points at the line that called the caller).
    """
    if not isinstance(name, str) or "{" not in name:
        return
    fields = unformatted_fields(name)
    if not fields:
        return
    with _warned_lock:
        if name in _warned:
            return
        if len(_warned) < WARNED_NAMES_KEPT:
            _warned.add(name)
    shown = ", ".join(f"{{{field}}}" for field in fields)
    given = ", ".join(f"{field}=..." for field in fields)
    warnings.warn(
        f"lock name {name!r} holds {shown}, which nothing formatted: every call locks this "
        f"one literal name. Pass the field{'s' if len(fields) > 1 else ''} "
        f"(rlock({name!r}, {given})) or format the name yourself (an f-string). Braces meant "
        "literally: see 'Names built from fields' in docs/django.md",
        UnformattedNameWarning,
        stacklevel=stacklevel + 1,
    )


def warn_unformatted_from_user(name: object, *, stacklevel: int) -> None:
    """:func:`warn_unformatted` for a backend's factory (``locks["default"].lock(name)``).

    Only when the factory's caller is the user's code: this package's own
    callers (``rlock()``, ``@locked``, ``LockedTask``) pass names they formatted
    or already warned about. ``stacklevel`` is as for :func:`warn_unformatted`.
    """
    if not isinstance(name, str) or "{" not in name:
        return  # the common case, at the cost of one test
    if called_from_machinery(stacklevel):
        return
    warn_unformatted(name, stacklevel=stacklevel + 1)


def format_name(template: object, fields: Mapping[str, object]) -> str:
    """The lock name ``template.format(**fields)``, built as ``@locked`` builds one.

    Raises ValueError when ``template`` is not a format string, has a
    positional field (``{}``, ``{0}``), uses a field not given, or is given a
    field it does not use (``rlock(f"order:{order_id}", order_id=...)``
    formatted twice, or a misspelt keyword). A name longer than the longest
    lock name is hashed, as :func:`build_key` does.
    """
    if not isinstance(template, str) or not template:
        raise ValueError(f"lock name template must be a non-empty str, got {template!r}")
    try:
        roots = _field_roots(template)
    except ValueError as error:
        raise ValueError(
            f"lock name template {template!r} is not a format string: {error}"
        ) from None
    if any(not root or root.isdigit() for root in roots):
        raise ValueError(
            f"lock name template {template!r} must name its fields ({{order_id}}), not number them"
        )
    unused = [field for field in fields if field not in roots]
    if unused:
        raise ValueError(
            f"lock name template {template!r} does not use "
            f"{', '.join(map(repr, unused))}: a name built already (an f-string) takes "
            "no fields, and a template names each field it is given ({order_id})"
        )
    missing = list(dict.fromkeys(root for root in roots if root not in fields))
    if missing:
        raise ValueError(
            f"lock name template {template!r} needs the field"
            f"{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}: "
            f"pass {'them' if len(missing) > 1 else 'it'} as keywords "
            f"({', '.join(f'{field}=...' for field in missing)})"
        )
    try:
        name = template.format(**fields)
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as error:
        raise ValueError(
            f"cannot build a lock name from {template!r}: {type(error).__name__}: {error}"
        ) from None
    return fit_name(name)
