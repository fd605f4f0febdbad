"""Fault 8: a least-privilege ACL user, and a TLS-only server.

``MINIMAL_ACL`` is the ACL rule the README publishes: keys and channels under
the lock prefix, and exactly the commands the client and its scripts run
(scripts' own commands are checked by ACL too). The lifecycle below runs
every one of them; removing any single one breaks it with a NOPERM error that
names the command.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio

from django_rlock.core import FairLock, LockClient, LockLostError, LockUnavailableError
from django_rlock.core._process.identity import thread_owner
from django_rlock.core._protocol.lock import SCRIPT_COMMANDS, LockScripts
from django_rlock.core.aio import AsyncLockClient
from tests.faults.recorder import current_hold
from tests.servers import RedisServer, free_port

pytestmark = pytest.mark.faults

#: Commands the client sends itself besides those the scripts run (inspection
#: uses exists, hexists, hget and pttl, which the scripts run too).
CLIENT_COMMANDS = ["evalsha", "script|load", "subscribe", "unsubscribe"]
COMMANDS = CLIENT_COMMANDS + list(SCRIPT_COMMANDS)


def acl_rule(prefix: str, commands: list[str]) -> str:
    """The ACL rules (after ``ACL SETUSER <name> on >password``) for ``prefix``."""
    return f"resetkeys ~{prefix}:* resetchannels &{prefix}:* -@all " + " ".join(
        f"+{command}" for command in commands
    )


MINIMAL_ACL = "user rlock on >PASSWORD " + acl_rule("rlock", COMMANDS)


def _set_user(admin: redis.Redis, commands: list[str]) -> None:
    admin.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", "locker", "reset", "on", ">pw", *acl_rule("rlock", commands).split()
    )


def lifecycle(client: LockClient, admin: redis.Redis) -> None:
    """Every path of the engine once: grant, re-entry, inspection, renewal, waits, release."""
    admin.script_flush()  # the first calls must load their scripts (SCRIPT LOAD)
    lock = client.lock("acl")
    assert lock.acquire() and lock.acquire()
    assert lock.locked() and lock.owned() and lock.hold_count() == 2
    ttl = lock.ttl()
    assert ttl is not None and ttl > 0
    (left,) = client.renew_batch([current_hold(lock, thread_owner())])
    assert left > 0
    lock.release()

    # A semaphore's permit: its index set (smembers, sadd, srem).
    semaphore = client.semaphore("acl-permits", 2)
    assert semaphore.acquire() and semaphore.available() == 1
    semaphore.release()

    # A wait woken by a release (pub/sub), then a wait given up (abandon).
    for hold_for, wait, expect in ((0.2, 2.0, True), (0.6, 0.1, False)):
        held = threading.Event()
        failed: list[BaseException] = []
        holder = threading.Thread(target=_hold_busy, args=(client, held, hold_for, failed))
        holder.start()
        assert held.wait(2)
        granted = client.lock("busy").acquire(timeout=wait)
        holder.join(5)
        if failed:
            raise failed[0]  # the holder's release was refused: that is the error to report
        assert granted is expect
        if expect:
            client.lock("busy").release()

    # A waiter that gives up just as the lock is freed passes the wake-up on:
    # the rare path of the abandon script, forced here with a registered waiter.
    busy = client.lock("busy")
    admin.zadd(busy.keys.waiters, {"other-waiter": time.time() * 1000 + 60_000})
    assert (
        client.scripts[LockScripts].abandon(
            keys=[busy.keys.hash, busy.keys.channel, busy.keys.waiters], args=["gone", "publish"]
        )
        == 1
    )

    # A grant declared lost while its key lives on: the owner's next acquire
    # takes it off the server first (hdel), then grants afresh.
    stale = client.lock("acl-stale")
    assert stale.acquire(lease=10)
    hold = client.holds.newest(stale.keys.hash, thread_owner())
    assert hold is not None
    client.holds.declare_lost(hold, "declared lost by the ACL test")
    assert stale.acquire(lease=10)
    assert stale.token is not None and stale.token > hold.token
    stale.release()
    with pytest.raises(LockLostError):
        stale.release()

    # A read-write lock: a read (sadd), its inspection and release (smembers, srem), a write.
    rw = client.read_write_lock("acl-rw")
    with rw.read:
        assert rw.read.locked()
    with rw.write:
        assert rw.write.owned()

    # A fair lock: a grant, and a waiter queued behind its holder that gives up.
    fair = client.fair_lock("fair")
    assert fair.acquire()
    queued: list[object] = []
    waiter = threading.Thread(target=_queue_behind, args=(fair, queued))
    waiter.start()
    waiter.join(5)
    fair.release()
    if isinstance(queued[0], BaseException):
        raise queued[0]
    assert queued == [False]

    lock.release()
    assert lock.acquire()
    assert lock.force_release()
    with pytest.raises(Exception, match="lost"):
        lock.release()


def _queue_behind(lock: FairLock, outcome: list[object]) -> None:
    try:
        outcome.append(lock.acquire(timeout=0.1))
    except Exception as error:  # noqa: BLE001 -- handed to the test's thread
        outcome.append(error)


def _hold_busy(
    client: LockClient, held: threading.Event, seconds: float, failed: list[BaseException]
) -> None:
    try:
        with client.lock("busy"):
            held.set()
            time.sleep(seconds)
    except Exception as error:  # noqa: BLE001 -- handed to the test's thread
        failed.append(error)
        held.set()


@pytest.fixture
def acl_server(start_server: object) -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def test_minimal_acl_runs_the_whole_lifecycle(acl_server: RedisServer) -> None:
    admin = acl_server.client()
    _set_user(admin, COMMANDS)
    user_url = f"redis://locker:pw@127.0.0.1:{acl_server.port}/0"
    # deadlock_timeout: the first wait below checks for a deadlock (its edge, its walk).
    with LockClient(
        user_url, key_prefix="rlock", watchdog_timeout=3, deadlock_timeout=0.05
    ) as client:
        lifecycle(client, admin)
    with (
        LockClient(user_url, key_prefix="other") as outside,
        # Redis: "this user has no permissions to access one of the keys ...";
        # Valkey: "No permissions to access a key".
        pytest.raises(redis.exceptions.NoPermissionError, match=r"(?i)no permissions|may not run"),
    ):
        outside.lock("x").acquire()
    admin.close()


@pytest.mark.parametrize("missing", COMMANDS)
def test_each_missing_permission_fails_with_a_clear_noperm(
    acl_server: RedisServer, missing: str, caplog: pytest.LogCaptureFixture
) -> None:
    admin = acl_server.client()
    _set_user(admin, [command for command in COMMANDS if command != missing])
    user_url = f"redis://locker:pw@127.0.0.1:{acl_server.port}/0"
    caplog.set_level(logging.WARNING)
    error: BaseException | None = None
    # deadlock_timeout: the first wait below checks for a deadlock (its edge, its walk).
    with LockClient(
        user_url, key_prefix="rlock", watchdog_timeout=3, deadlock_timeout=0.05
    ) as client:
        try:
            lifecycle(client, admin)
        except (redis.RedisError, AssertionError) as raised:
            error = raised
        leaked = admin.pubsub_channels("rlock:*")
    if missing == "unsubscribe":
        # Refused UNSUBSCRIBEs are answered on the pub/sub connection after
        # its waiters left: what shows is the channels left subscribed.
        assert leaked
        return
    if missing == "pubsub|numsub":
        # The release asks for it with pcall: without it (an ACL written for an
        # older version), a starving waiter is woken instead of handed the lock.
        assert error is None, error
        return
    if missing == "subscribe":
        # Waiting falls back to PTTL waits (a release may no longer wake
        # anyone early), and the log says why.
        assert "pub/sub subscription refused" in caplog.text
        assert "no permissions to run the 'subscribe' command" in caplog.text
        return
    assert isinstance(error, redis.exceptions.NoPermissionError), error
    message = str(error)
    if "lock scripts need" in message:
        # Refused inside a script: Redis names only the script line, so the
        # engine lists what the scripts run.
        assert missing in message.split("The scripts run:")[1].split(";", maxsplit=1)[0].split()
    else:
        # Redis 6.2 names a refused subcommand's parent ("the 'script' command or its subcommand").
        parent = missing.split("|", maxsplit=1)[0]
        assert (
            f"no permissions to run the '{missing}' command" in message
            or f"no permissions to run the '{parent}' command or its subcommand" in message
        )
    admin.close()


def test_minimal_acl_line_is_what_the_readme_shows() -> None:
    assert MINIMAL_ACL == (
        "user rlock on >PASSWORD resetkeys ~rlock:* resetchannels &rlock:* -@all "
        "+evalsha +script|load +subscribe +unsubscribe +exists +hexists +hget +hset "
        "+hincrby +pttl +pexpire +get +set +del +zadd +zrem +zrange "
        "+zremrangebyscore +zcard +publish +time +sadd +srem +smembers +zscore +hdel +hgetall "
        "+hmget +pubsub|numsub"
    )


# -- TLS ---------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway CA and a server certificate for 127.0.0.1 signed by it."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a CA at test time")
    where = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-subj", "/CN=rlock test CA", "-keyout", "ca.key", "-out", "ca.crt",
             cwd=where)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
             "-keyout", "server.key", "-out", "server.csr", cwd=where)  # fmt: skip
    (where / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "1", "-extfile", "san.ext", "-out", "server.crt",
             cwd=where)  # fmt: skip
    return where


class TlsRedisServer(RedisServer):
    """A redis-server listening on TLS only (``--port 0``)."""

    def __init__(self, certificates: Path) -> None:
        self.ca = str(certificates / "ca.crt")
        tls_port = free_port()
        super().__init__(
            "--port", "0", "--tls-port", str(tls_port),
            "--tls-cert-file", str(certificates / "server.crt"),
            "--tls-key-file", str(certificates / "server.key"),
            "--tls-ca-cert-file", self.ca, "--tls-auth-clients", "no",
            port=tls_port,
        )  # fmt: skip

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1",
            port=self.port,
            ssl=True,
            ssl_ca_certs=self.ca,
            **kwargs,  # type: ignore[arg-type]
        )


def test_tls_only_server_works_through_rediss_and_refuses_plaintext(certificates: Path) -> None:
    server = TlsRedisServer(certificates)
    try:
        server.start()
    except RuntimeError:
        server.__exit__(None, None, None)
        pytest.skip("this redis-server cannot serve TLS (built without it)")
    try:
        url = f"rediss://127.0.0.1:{server.port}/0"
        caller = redis.Redis.from_url(url, ssl_ca_certs=server.ca)
        with LockClient(caller, key_prefix="rlock", watchdog_timeout=1.5) as client:
            admin = server.client()
            lifecycle(client, admin)
            lock = client.lock("renewed")
            assert lock.acquire()
            time.sleep(1.0)  # two renewals over TLS, on the derived renewal connection
            assert not lock.lost and lock.ttl() is not None
            lock.release()
            admin.close()
        caller.close()

        started = time.monotonic()
        with (
            LockClient(f"redis://127.0.0.1:{server.port}/0?socket_timeout=2") as plain,
            pytest.raises(LockUnavailableError),
        ):
            plain.lock("x").acquire()
        assert time.monotonic() - started < 10
    finally:
        server.__exit__(None, None, None)


async def async_lifecycle(client: AsyncLockClient, admin: redis.Redis) -> None:
    """The asyncio engine's lean calls once each: grant, re-entry, releases, a woken wait."""
    admin.script_flush()  # the first calls must load their scripts (SCRIPT LOAD)
    lock = client.lock("acl")
    assert await lock.acquire() and await lock.acquire()
    assert await lock.owned() and await lock.hold_count() == 2
    await lock.release()
    await lock.release()
    assert not await lock.locked()

    async def hold_briefly() -> None:
        async with client.lock("busy"):
            held.set()
            await asyncio.sleep(0.2)

    held = asyncio.Event()
    holder = asyncio.ensure_future(hold_briefly())
    await held.wait()
    busy = client.lock("busy")
    assert await busy.acquire(timeout=5)  # woken by the holder's release
    await busy.release()
    await holder


def test_asyncio_minimal_acl_and_a_missing_script_command(acl_server: RedisServer) -> None:
    admin = acl_server.client()
    user_url = f"redis://locker:pw@127.0.0.1:{acl_server.port}/0"

    async def scenario(missing: str) -> None:
        async with AsyncLockClient(user_url, key_prefix="rlock", watchdog_timeout=3) as client:
            if not missing:
                await async_lifecycle(client, admin)
                return
            with pytest.raises(redis.exceptions.NoPermissionError) as refused:
                await client.lock("acl").acquire()
            # Refused inside a script on the lean path: what to grant, as on redis-py's.
            assert "lock scripts need" in str(refused.value)

    _set_user(admin, COMMANDS)
    asyncio.run(scenario(""))
    _set_user(admin, [command for command in COMMANDS if command != "hset"])
    asyncio.run(scenario("hset"))
    admin.close()


def test_asyncio_over_tls(certificates: Path) -> None:
    server = TlsRedisServer(certificates)
    try:
        server.start()
    except RuntimeError:
        server.__exit__(None, None, None)
        pytest.skip("this redis-server cannot serve TLS (built without it)")
    try:
        url = f"rediss://127.0.0.1:{server.port}/0"
        admin = server.client()

        async def scenario() -> None:
            caller = redis.asyncio.Redis.from_url(url, ssl_ca_certs=server.ca)
            async with AsyncLockClient(caller, key_prefix="rlock", watchdog_timeout=1.5) as client:
                await async_lifecycle(client, admin)
                assert client._wire.lean  # the TLS socket was taken over
                lock = client.lock("renewed")
                assert await lock.acquire()
                await asyncio.sleep(1.0)  # two renewals over TLS, on the sync twin's connection
                assert not lock.lost and await lock.ttl() is not None
                await lock.release()
            await caller.aclose()

        asyncio.run(scenario())
        admin.close()
    finally:
        server.__exit__(None, None, None)
