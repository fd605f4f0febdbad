"""``rlock(template, **fields)`` formats as ``@locked`` does; a forgotten ``f`` is told.

``rlock("order:{order_id}")`` with the ``f`` forgotten used to lock the literal
name in silence: every order shared one lock. Now fields format the template
(and the metrics count it under the template), and a bare ``{field}`` left in
a name given without fields warns once per name, naming the field, except in
the Redis hash-tag form that opens a name (``{tenant}:orders``).
"""

from __future__ import annotations

import asyncio
import uuid
import warnings
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import REGISTRY
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import locked, locks, rlock
from django_rlock._keys import UnformattedNameWarning, unformatted_fields


def unique(prefix: str) -> str:
    """A name no other test warned about (the warning is once per name, per process)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass
class Customer:
    pk: int


def test_fields_format_the_name_as_locked_does() -> None:
    @locked("report:{customer.pk}:{kind}")
    def build(customer: Customer, kind: str) -> str:
        return "built"

    lock = rlock("report:{customer.pk}:{kind}", customer=Customer(7), kind="daily")
    assert lock.name == "report:7:daily"
    assert lock.key_template == "report:{customer.pk}:{kind}"
    with lock:
        # The very lock @locked takes for the same arguments, and the same one
        # locks["default"] names directly.
        assert locks["default"].lock("report:7:daily").locked()
        assert build(Customer(7), "daily") == "built"  # re-entered by this thread


def test_a_field_may_be_called_like_an_argument_of_rlock() -> None:
    lock = rlock("user:{name}", name="ada")
    assert lock.name == "user:ada"


def test_fields_work_with_async_with() -> None:
    async def scenario() -> tuple[str, str | None]:
        async with rlock("order:{order_id}", order_id=5, timeout=5) as lock:
            assert locks["default"].lock("order:5").locked()
            return lock.name, getattr(lock, "key_template", None)

    assert asyncio.run(scenario()) == ("order:5", "order:{order_id}")


@pytest.mark.parametrize(
    ("template", "fields", "message"),
    [
        ("order:{order_id}", {"id": 1}, r"does not use 'id'"),
        ("order:{order_id}:{line}", {"order_id": 1}, r"needs the field 'line'.*line=\.\.\."),
        ("order:42", {"order_id": 42}, r"a name built already \(an f-string\) takes no fields"),
        ("order:{}", {"order_id": 1}, r"must name its fields"),
        ("order:{order_id", {"order_id": 1}, r"is not a format string"),
        ("report:{customer.pk}", {"customer": object()}, r"AttributeError"),
    ],
)
def test_a_template_and_fields_that_do_not_fit_are_refused(
    template: str, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        rlock(template, **fields)


def test_a_bare_field_in_a_name_without_fields_warns_once_naming_it() -> None:
    name = unique("order") + ":{order_id}"
    with pytest.warns(UnformattedNameWarning, match=r"holds \{order_id\}") as caught:
        rlock(name)
    assert len(caught) == 1
    warning = caught[0]
    assert warning.filename == __file__  # it points at the caller's line
    assert "order_id=..." in str(warning.message)
    assert issubclass(warning.category, RuntimeWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rlock(name)  # once per name: the second time is silent


def test_every_bare_field_of_the_name_is_named() -> None:
    name = unique("report") + ":{customer.pk}:{kind!s}:{row[id]}"
    with pytest.warns(UnformattedNameWarning) as caught:
        rlock(name)
    assert "{customer}, {kind}, {row}" in str(caught[0].message)


@pytest.mark.parametrize("factory", ["lock", "fair_lock", "read_write_lock", "semaphore"])
def test_the_alias_factories_warn_as_rlock_does(factory: str) -> None:
    name = unique(factory) + ":{order_id}"
    factory_of = getattr(locks["default"], factory)
    extra = (2,) if factory == "semaphore" else ()

    def make(name: str) -> object:
        return factory_of(name, *extra)

    with pytest.warns(UnformattedNameWarning, match=r"holds \{order_id\}") as caught:
        factory_of(name, *extra)
    assert len(caught) == 1 and caught[0].filename == __file__  # the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make(name)  # once per name
        make(unique(factory) + ":42")
        make("{tenant}:" + unique(factory))  # a hash tag


def test_names_the_package_formatted_itself_do_not_warn_again() -> None:
    @locked("order:{order_id}")
    def pay(order_id: str) -> str:
        return "paid"

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # A value's braces are the caller's data: @locked formatted the name.
        assert pay(unique("x") + "{order_id}") == "paid"


@pytest.mark.parametrize(
    "name",
    [
        "{tenant}:orders",  # the Redis hash-tag form, at the name's start
        "{user1000}.following",
        "report:{7}",  # positional braces: no template means them
        "a{b-c}d",
        "odd{",
        "order:42",
    ],
)
def test_hash_tags_and_other_braces_do_not_warn(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rlock(name)
        rlock("order:{order_id}", order_id="{x}")  # a value's braces are the caller's data


def test_what_counts_as_a_bare_field() -> None:
    assert unformatted_fields("order:{order_id}") == ["order_id"]
    assert unformatted_fields("{order_id}") == ["order_id"]  # a whole name is no hash tag
    assert unformatted_fields("{tenant}:order:{order_id}") == ["order_id"]
    assert unformatted_fields("{a}:{a}:{b:>5}") == ["a", "b"]
    assert unformatted_fields("{42}:x") == []


def test_metrics_count_a_formatted_name_under_its_template(settings: SettingsWrapper) -> None:
    settings.RLOCK_METRICS = "prometheus"
    template = unique("invoice") + ":{invoice_id}"

    def acquired(lock: str) -> float:
        labels = {"alias": "default", "lock": lock, "outcome": "acquired"}
        return REGISTRY.get_sample_value("django_rlock_acquisitions_total", labels) or 0.0

    for invoice_id in (1, 2, 3):
        with rlock(template, invoice_id=invoice_id):
            pass
    assert acquired(template) == 3
    assert acquired(template.replace("{invoice_id}", "1")) == 0
