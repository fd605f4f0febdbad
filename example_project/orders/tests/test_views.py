"""The pay and refund views: locked read-modify-writes, 409 when busy, over real HTTP."""

from __future__ import annotations

import json
import threading

import pytest
from django.test import Client
from django_rlock.testing import held_elsewhere
from pytest_django.live_server_helper import LiveServer

from demo.checks import Section, balance_errors, violations
from demo.load import post_json
from orders.models import Entry, Order


def post(client: Client, url: str, amount: int) -> tuple[int, dict[str, object]]:
    response = client.post(url, json.dumps({"amount": amount}), content_type="application/json")
    body = json.loads(response.content) if response["Content-Type"] == "application/json" else {}
    return response.status_code, body


def test_pay_charges_the_balance_and_records_the_fencing_token(
    client: Client, order: Order
) -> None:
    status, body = post(client, f"/orders/{order.pk}/pay/", 2_500)

    assert status == 200
    order.refresh_from_db()
    entry = Entry.objects.get(order=order)
    assert (order.balance, entry.amount, entry.kind) == (7_500, 2_500, "payment")
    assert entry.source == "web"
    assert body["fence"] == entry.fence == order.fence > 0


def test_pay_never_charges_more_than_the_balance(client: Client, order: Order) -> None:
    assert post(client, f"/orders/{order.pk}/pay/", 9_000)[0] == 200
    status, body = post(client, f"/orders/{order.pk}/pay/", 9_000)

    assert (status, body["amount"], body["balance"]) == (200, 1_000, 0)


def test_refund_gives_back_what_was_paid(client: Client, order: Order) -> None:
    post(client, f"/orders/{order.pk}/pay/", 4_000)
    status, body = post(client, f"/orders/{order.pk}/refund/", 10_000)

    assert (status, body["amount"], body["balance"]) == (200, 4_000, 10_000)


def test_bad_amounts_are_refused(client: Client, order: Order) -> None:
    assert post(client, f"/orders/{order.pk}/pay/", 0)[0] == 400
    response = client.post(f"/orders/{order.pk}/refund/", "x", content_type="application/json")
    assert response.status_code == 400


def test_refund_of_a_busy_order_answers_409_with_retry_after(client: Client, order: Order) -> None:
    with held_elsewhere(Order.lock_name(order.pk)):
        response = client.post(
            f"/orders/{order.pk}/refund/", '{"amount": 100}', content_type="application/json"
        )

    assert response.status_code == 409
    assert int(response["Retry-After"]) >= 1
    assert not Entry.objects.filter(order=order).exists()


def test_pay_waits_for_a_busy_order_then_pays(client: Client, order: Order) -> None:
    with held_elsewhere(Order.lock_name(order.pk), lease=0.5):
        status, body = post(client, f"/orders/{order.pk}/pay/", 100)

    assert (status, body["balance"]) == (200, 9_900)


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_over_http_change_an_order_one_at_a_time(
    live_server: LiveServer, order: Order
) -> None:
    port = int(live_server.url.rsplit(":", 1)[1])
    errors: list[BaseException] = []

    def customer(operation: str) -> None:
        try:
            for _ in range(5):
                post_json(port, f"/orders/{order.pk}/{operation}/", {"amount": 1_500})
        except BaseException as error:  # noqa: BLE001 -- reported by the assertion below
            errors.append(error)

    threads = [
        threading.Thread(target=customer, args=(operation,))
        for operation in ["pay"] * 4 + ["refund"] * 2  # refunds may meet 409s: they count
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    order.refresh_from_db()
    entries = list(Entry.objects.filter(order=order))
    sections = [
        Section(e.fence, e.held_from, e.held_until, e.balance_before, e.balance_after)
        for e in entries
    ]
    paid = sum(e.amount for e in entries if e.kind == Entry.PAYMENT)
    refunded = sum(e.amount for e in entries if e.kind == Entry.REFUND)
    assert all("409" in str(error) for error in errors), errors
    assert len(entries) >= 20
    assert violations(sections, order.total) == []
    assert balance_errors(order.total, order.balance, paid, refunded) == []
