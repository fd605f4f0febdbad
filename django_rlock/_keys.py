"""Lock names built from a function's call: shared by ``django_rlock.locked`` and Celery.

A key template is either a ``str.format`` template whose fields name the
function's parameters (``"order:{order_id}"``, ``"user:{request.user.pk}"``),
or a callable taking the same arguments as the function. Arguments are bound
with :func:`inspect.signature` and defaults applied, so ``f(1)`` and
``f(order_id=1)`` lock the same name. Django-free.
"""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable
from typing import Any

from django_rlock.core._protocol.names import fit_name

#: A format string naming the function's parameters, or a callable with its signature.
KeyTemplate = str | Callable[..., str]


def _field_roots(template: str) -> list[str]:
    roots = []
    for _, field, _, _ in string.Formatter().parse(template):
        if field is None:
            continue
        root = field.split(".", 1)[0].split("[", 1)[0]
        roots.append(root)
    return roots


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
        bound = inspect.signature(func).bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        for name, parameter in inspect.signature(func).parameters.items():
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                arguments.update(arguments.pop(name, {}))
        try:
            key = template.format(**arguments)
        except (KeyError, AttributeError, IndexError, TypeError, ValueError) as error:
            raise ValueError(
                f"cannot build lock key from {template!r} for {func.__qualname__}: "
                f"{type(error).__name__}: {error}"
            ) from None
    return fit_name(key)
