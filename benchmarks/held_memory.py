"""Bytes a held lock keeps on the server, per kind, by who holds it (issue 32).

Redis keeps a hash as a listpack only while every value is at most
``hash-max-listpack-value`` (64 B by default); one longer value makes it a hash
table for the rest of its life, over twice the bytes. A grant writes its
holder's description in the lock's hash, so the size of a held lock depends on
who holds it. For each kind, held through this tree's public API on a fresh
redis-server (default configuration), as described by a process on a short
host, on a realistic cloud host, and by a Celery task on that host: the
``MEMORY USAGE`` of every key while held (summed), and the encoding of each
hash that carries the description.

Run: ``python -m benchmarks.held_memory``. To compare with another revision,
run it in a checkout of that revision (it uses only what every release has).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from django_rlock.core import LockClient
from django_rlock.core._process import holder
from django_rlock.core._process.holder import holder_details
from tests.servers import RedisServer

#: Who holds: (host, Celery task id and name or None).
HOLDERS: dict[str, tuple[str, tuple[str, str] | None]] = {
    "short host": ("web-1", None),
    "realistic host": ("ip-10-0-12-34.ec2.internal", None),
    "Celery task, realistic host": (
        "ip-10-0-12-34.ec2.internal",
        ("5f2b9c3e-8a41-4d7e-9b0c-2e6f1a7d4c58", "shop.billing.tasks.charge_customer"),
    ),
}

Kind = Callable[[LockClient, LockClient], AbstractContextManager[object]]

KINDS: dict[str, Kind] = {
    "lock": lambda client, _: client.lock("order:12345"),
    "fair lock": lambda client, _: client.fair_lock("order:12345"),
    "rw read": lambda client, _: client.read_write_lock("order:12345").read,
    "rw write": lambda client, _: client.read_write_lock("order:12345").write,
    "semaphore": lambda client, _: client.semaphore("order:12345", 2),
    'lock, layout="redisson"': lambda _, java: java.lock("order:12345"),
}


@contextmanager
def described_as(host: str, task: tuple[str, str] | None) -> Iterator[None]:
    """Descriptions made in the block name ``host`` (and the Celery ``task``)."""
    saved = holder._HOST
    holder._HOST = host
    holder._encoded.cache_clear()
    holder._made.plain = None
    try:
        if task is None:
            yield
        else:
            with holder_details(task_id=task[0], task_name=task[1]):
                yield
    finally:
        holder._HOST = saved
        holder._encoded.cache_clear()
        holder._made.plain = None


def measure() -> tuple[dict[str, dict[str, tuple[int, str]]], str]:
    """{kind: {holder: (bytes held, encodings of the described hashes)}}, and the server."""
    results: dict[str, dict[str, tuple[int, str]]] = {}
    with RedisServer() as server:
        admin = server.client()
        version = str(admin.info("server")["redis_version"])
        with (
            LockClient(server.url, key_prefix="rlock") as client,
            LockClient(server.url, key_prefix="rlock", layout="redisson") as java,
        ):
            for kind, make in KINDS.items():
                for who, (host, task) in HOLDERS.items():
                    admin.flushall()
                    with described_as(host, task), make(client, java):
                        keys = list(admin.scan_iter(count=1000))
                        size = sum(int(admin.memory_usage(k, samples=0) or 0) for k in keys)
                        encodings = sorted(
                            str(admin.object("encoding", key), "ascii")
                            for key in keys
                            if admin.type(key) == b"hash" and admin.hexists(key, "~holder")
                        )
                    results.setdefault(kind, {})[who] = (size, "+".join(encodings))
        admin.close()
    thread = threading.current_thread().name
    return results, f"redis-server {version}, default configuration, thread {thread!r}"


def table(results: dict[str, dict[str, tuple[int, str]]], note: str) -> str:
    """The markdown table of ``results``."""
    lines = [
        "| held by | " + " | ".join(HOLDERS) + " |",
        "|---|" + "---:|" * len(HOLDERS),
    ]
    for kind, row in results.items():
        cells = [f"{size} B ({encoding})" for size, encoding in row.values()]
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    lines.append(f"\n{note}; bytes: MEMORY USAGE of every key while held, summed.")
    return "\n".join(lines)


def main() -> None:
    """Print the table."""
    results, note = measure()
    print(table(results, note))


if __name__ == "__main__":
    main()
