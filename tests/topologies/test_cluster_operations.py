"""Cluster operations under contention: a slot moved by hand, then a manual failover.

While a slot migrates (``CLUSTER SETSLOT ... MIGRATING/IMPORTING``), Redis refuses
every script on the lock's keys with TRYAGAIN or ASK until the move is
finished, and redis-py gives up after its own 16 tries with
``ClusterError: TTL exhausted.``; a manual failover answers MOVED until every
client has the new map. Threads keep acquiring and releasing one lock in that
slot throughout: what they may see is a grant, a release, or
LockUnavailableError, never a bare redis-py error; no two ever hold the lock at
once, and the last release frees it at once (not a watchdog timeout later).

A slot's move also drops the subscriptions of the lock's waiters on the node it
leaves (Redis 7's sharded pub/sub): they must subscribe again where it went and
be woken by the next release, not wait out the holder's life.
"""

from __future__ import annotations

import itertools
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis

from django_rlock.core import LockClient
from django_rlock.core._protocol.fairlock import FairKeys
from django_rlock.core._protocol.holds import Hold
from django_rlock.core._sync.sharding import ShardedReleaseListener, slot_of
from django_rlock.core._sync.watchdog import get_watchdog
from django_rlock.core.exceptions import LockUnavailableError
from tests.servers import RedisServer
from tests.topologies.builders import Cluster, wait_until
from tests.topologies.conftest import Renewals, held_locks, running

pytestmark = pytest.mark.slow

#: How long the slot stays half-moved: longer than redis-py's own retries of a
#: TRYAGAIN (16 tries, about 0.4 s), so that they run out while it lasts.
MIGRATION_WINDOW = 1.2

#: Threads taking the lock, each through a client of its own.
WORKERS = 3

#: The workers' watchdog timeout, in seconds. A manual failover pauses the old
#: master's writes for up to 10 s (twice Redis's 5 s manual failover timeout)
#: and a loaded machine may use all of it: a lease shorter than that rightly
#: runs out there, and the holder is told (LockLostError at release). This
#: test asserts what clients see while nothing is lost, so the lease outlasts
#: a pause and the renewal that may have failed just before it (the default).
WORKER_LEASE = 30


@pytest.fixture(scope="module")
def cluster_with_replicas() -> Iterator[Cluster]:
    """3 masters and 3 replicas (a manual failover needs a replica)."""
    topology = Cluster(3, replicas=1)
    with running(topology):
        yield topology


def _command(node: RedisServer, *args: object) -> object:
    probe = node.client(socket_timeout=10)
    try:
        return probe.execute_command(*args)  # type: ignore[no-untyped-call]
    finally:
        probe.close()


def _node_id(node: RedisServer) -> str:
    reply = _command(node, "CLUSTER", "MYID")
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def _by_port(cluster: Cluster, port: int) -> RedisServer:
    return next(node for node in cluster.nodes if node.port == port)


def _owner_of(cluster: Cluster, slot: int, asked: RedisServer) -> RedisServer:
    """The master serving ``slot``, as node ``asked`` sees it."""
    ranges = _command(asked, "CLUSTER", "SLOTS")
    assert isinstance(ranges, list)
    for start, end, master, *_replicas in ranges:
        if int(start) <= slot <= int(end):
            return _by_port(cluster, int(master[1]))
    raise AssertionError(f"no master serves slot {slot}")


def _replica_of(cluster: Cluster, master: RedisServer) -> RedisServer:
    probe = master.client(socket_timeout=5)
    try:
        info = probe.info("replication")
    finally:
        probe.close()
    assert isinstance(info, dict)
    return _by_port(cluster, int(info["slave0"]["port"]))


def _is_master(node: RedisServer) -> bool:
    probe = node.client(socket_timeout=5)
    try:
        info = probe.info("replication")
    finally:
        probe.close()
    return isinstance(info, dict) and info.get("role") == "master"


def _start_moving(cluster: Cluster, slot: int, source: RedisServer) -> RedisServer:
    """Half-move ``slot``: MIGRATING on ``source``, IMPORTING on another master (returned).

    As ``redis-cli --cluster reshard`` does before it moves the keys; until
    :func:`_finish_moving`, scripts on the slot's keys are refused.
    """
    target = next(node for node in cluster.nodes if node is not source and _is_master(node))
    source_id, target_id = _node_id(source), _node_id(target)
    _command(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
    _command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
    return target


def _finish_moving(cluster: Cluster, slot: int, source: RedisServer, target: RedisServer) -> None:
    """Move the keys of the half-moved ``slot``, then give it to ``target`` everywhere."""
    target_id = _node_id(target)
    for _ in range(100):  # bounded: a key the workers write meanwhile is moved next round
        keys = _command(source, "CLUSTER", "GETKEYSINSLOT", slot, 1000)
        assert isinstance(keys, list)
        if keys:
            _command(source, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
            continue
        _command(target, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        try:
            _command(source, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
            break
        except redis.ResponseError:  # it still holds keys of the slot: another round
            continue
    else:
        raise AssertionError(f"could not finish moving slot {slot}")
    for node in cluster.nodes:
        if node not in (source, target) and _is_master(node):
            _command(node, "CLUSTER", "SETSLOT", slot, "NODE", target_id)


def _move_slot_by_hand(cluster: Cluster, slot: int, source: RedisServer) -> RedisServer:
    """Move ``slot`` to another master (returned), half-moved for :data:`MIGRATION_WINDOW` s."""
    target = _start_moving(cluster, slot, source)
    time.sleep(MIGRATION_WINDOW)
    _finish_moving(cluster, slot, source, target)
    return target


#: How long a takeover keeps the old master's writes paused at most, in ms
#: (ended as soon as it has stepped down).
TAKEOVER_PAUSE_MS = 60_000


def _failover(cluster: Cluster, slot: int, *, takeover: bool = False) -> RedisServer:
    """Promote the replica of ``slot``'s master (returned) once the old master has stepped down.

    ``takeover``: ``CLUSTER FAILOVER TAKEOVER``, which needs neither the
    master's handshake nor the other masters' votes, so a loaded machine's
    late cluster bus cannot stall it. Else a manual failover, the master
    paused until its replica has caught up.

    Either way no acknowledged write is lost: what a test asserts is how
    clients go through a failover, not what Redis does not promise. A
    takeover drops every write its replica has not received (replication is
    asynchronous; only ``min_replicas`` guards a grant against that): a lock
    renewal, a queue entry, a grant acknowledged by the old master between a
    ``WAIT`` and the takeover, or all of them when the ``WAIT`` timed out, and
    a holder or waiter would then rightly find its lock gone. So the old
    master's writes are paused (``CLIENT PAUSE WRITE``: the lock scripts and
    publishes sent to it wait, then are redirected to the new master) and the
    replica has acknowledged all it took before the takeover; the pause ends
    once the old master has stepped down.
    """
    master = _owner_of(cluster, slot, cluster.nodes[0])

    def replica_in_sync() -> bool:
        # A master stepped down by an earlier failover must attach and sync first.
        try:
            return Cluster._synced(_replica_of(cluster, master))
        except KeyError:  # no replica attached yet
            return False

    wait_until(replica_in_sync, 20, "a replica in sync")
    promoted = _replica_of(cluster, master)
    if takeover:
        _command(master, "CLIENT", "PAUSE", TAKEOVER_PAUSE_MS, "WRITE")
    try:
        if takeover:
            # Nothing is written now: once acknowledged, the replica has it all.
            for _ in range(10):  # bounded: 10 s for a loaded machine's replica to answer
                if _command(master, "WAIT", "1", "1000") == 1:
                    break
            else:
                raise AssertionError(f"the replica {promoted.port} did not catch up")
        # The replica sends its master a manual failover's request only over a live
        # cluster bus link, which a loaded machine may have just dropped (a ping
        # answered late): the request is lost, and the failover times out after
        # 5 s. Asked again after that, it starts afresh.
        for _ in range(4):  # bounded
            _command(promoted, "CLUSTER", "FAILOVER", *(["TAKEOVER"] if takeover else []))
            try:
                wait_until(
                    lambda: _owner_of(cluster, slot, promoted) is promoted, 6, "the failover"
                )
                break
            except TimeoutError:
                continue
        else:
            raise AssertionError(f"{promoted.port} did not take over from {master.port}")
        wait_until(lambda: not _is_master(master), 30, "the old master stepping down")
    finally:
        if takeover:
            _command(master, "CLIENT", "UNPAUSE")
    return promoted


def _named(error: BaseException) -> str:
    return f"{type(error).__module__}.{type(error).__qualname__}: {error}"


class Workers:
    """Threads taking and giving back one lock in turn, each through its own client."""

    def __init__(self, url: str, name: str) -> None:
        self.url, self.name = url, name
        self.stop = threading.Event()
        self.grants = 0
        self.unavailable: list[str] = []
        #: Anything else a call raised: a bare redis-py error is the bug.
        self.errors: list[str] = []
        self.overlaps = 0
        self.tokens: list[int] = []
        self._inside = 0
        self._guard = threading.Lock()
        self.threads = [threading.Thread(target=self._run) for _ in range(WORKERS)]

    def __enter__(self) -> Workers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in self.threads), "a worker hangs"

    def _run(self) -> None:
        with LockClient(self.url, key_prefix="test", watchdog_timeout=WORKER_LEASE) as client:
            lock = client.lock(self.name)
            while not self.stop.is_set():
                try:
                    if not lock.acquire(timeout=10):
                        continue
                except LockUnavailableError as error:
                    self.unavailable.append(f"acquire: {error}")
                    continue
                except Exception as error:  # noqa: BLE001 -- what escapes is the finding
                    self.errors.append(f"acquire: {_named(error)}")
                    continue
                self._hold(lock.token)
                try:
                    lock.release()
                except LockUnavailableError as error:
                    self.unavailable.append(f"release: {error}")
                except Exception as error:  # noqa: BLE001 -- what escapes is the finding
                    self.errors.append(f"release: {_named(error)}")

    def _hold(self, token: int | None) -> None:
        with self._guard:
            self._inside += 1
            self.overlaps += self._inside > 1
            self.grants += 1
            self.tokens.append(token or 0)
        time.sleep(0.002)
        with self._guard:
            self._inside -= 1

    def wait_for_grants(self, more: int, what: str) -> None:
        """Wait (bounded) until the workers have had ``more`` grants from now on."""
        target = self.grants + more
        wait_until(lambda: self.grants >= target, 20, f"{more} grants {what}")


def test_a_slot_moved_and_failed_over_under_contention(cluster_with_replicas: Cluster) -> None:
    cluster = cluster_with_replicas
    name = "moving"
    with LockClient(cluster.url, key_prefix="test") as probe:
        keys = probe.lock(name).keys
    slot = slot_of(keys.hash)
    source = _owner_of(cluster, slot, cluster.nodes[0])
    with Workers(cluster.url, name) as workers:
        workers.wait_for_grants(20, "before the move")
        _move_slot_by_hand(cluster, slot, source)
        workers.wait_for_grants(20, "after the move")
        promoted = _failover(cluster, slot)
        workers.wait_for_grants(20, "after the failover")
    assert not workers.errors, f"bare errors escaped: {workers.errors[:5]!r}"
    assert workers.overlaps == 0
    tokens = workers.tokens
    assert all(a < b for a, b in itertools.pairwise(tokens))  # each grant fenced above the last
    checker = redis.RedisCluster(host="127.0.0.1", port=promoted.port)
    try:
        # The last release gave it back: free now, not a watchdog timeout later.
        assert not checker.exists(keys.hash)
    finally:
        checker.close()


def _name_in_slot(client: LockClient, slot: int) -> str:
    """A lock name whose keys live in ``slot`` (found by trying names in order)."""
    for index in range(1_000_000):  # bounded: about 16384 tries find one
        name = f"neighbour:{index}"
        if slot_of(client.lock(name).keys.hash) == slot:
            return name
    raise AssertionError(f"no name found for slot {slot}")


def test_while_a_slot_is_half_moved(cluster_with_replicas: Cluster) -> None:
    """One attempt is refused as unavailable; an acquire and a release go through once it settles.

    The lock acquired during the move is another than the one released, in
    the same slot: a waiter woken by a release after a slot move is another
    matter (its subscription is dropped by the move).
    """
    cluster = cluster_with_replicas
    with LockClient(cluster.url, key_prefix="test", watchdog_timeout=5) as client:
        held = client.lock("half-moved")
        slot = slot_of(held.keys.hash)
        free = client.lock(_name_in_slot(client, slot))
        source = _owner_of(cluster, slot, cluster.nodes[0])
        done: dict[str, float] = {}
        errors: list[Exception] = []
        holding, moving = threading.Event(), threading.Event()

        def hold_then_release() -> None:
            try:
                with held:  # released (by the owner thread) while the slot is half-moved
                    holding.set()
                    moving.wait(10)
                done["released"] = time.monotonic()
            except Exception as error:  # noqa: BLE001 -- reported by the test thread
                errors.append(error)

        def acquire() -> None:
            try:
                if free.acquire(timeout=10):
                    done["granted"] = time.monotonic()
                    free.release()
            except Exception as error:  # noqa: BLE001 -- reported by the test thread
                errors.append(error)

        holder = threading.Thread(target=hold_then_release)
        holder.start()
        assert holding.wait(10)
        target = _start_moving(cluster, slot, source)
        try:
            with pytest.raises(LockUnavailableError, match="slot"):
                free.acquire(blocking=False)  # one attempt: refused, not "held by another"
            waiter = threading.Thread(target=acquire)
            waiter.start()
            moving.set()
            time.sleep(MIGRATION_WINDOW)  # both are refused meanwhile: redis-py gives up
            assert not done, "a call went through while the slot was half-moved"
            settled = time.monotonic()
        finally:
            moving.set()
            _finish_moving(cluster, slot, source, target)
        for thread in (holder, waiter):
            thread.join(15)
        assert not errors
        # Both were resent until the slot answered, and went through then.
        assert done.get("released", 0) >= settled
        assert done.get("granted", 0) >= settled
        assert not held.lost
        assert not held.locked()
        assert not free.locked()


#: The held lock's life (the watchdog timeout): a waiter that misses its release
#: waits most of it out.
HELD_LOCK_LIFE = 10

#: How late after the release before it a waiter may be granted. The goal is
#: 100 ms; this bound leaves room for a loaded machine and still fails a
#: waiter that waited out the lock's life instead of being woken.
WAKE_BOUND = 1.5


class Queue:
    """Waiters queued on one held lock: two threads of one client (one listener), two alone.

    Each takes the lock in turn once the holder gives it back, holds it
    briefly and gives it back; the grants and releases are timed.
    """

    def __init__(self, url: str, name: str, kind: str) -> None:
        self.name, self.kind = name, kind
        self.clients = [LockClient(url, key_prefix="test", watchdog_timeout=HELD_LOCK_LIFE)]
        self.clients += [self.clients[0]] + [
            LockClient(url, key_prefix="test", watchdog_timeout=HELD_LOCK_LIFE) for _ in range(2)
        ]
        self.holder = LockClient(url, key_prefix="test", watchdog_timeout=HELD_LOCK_LIFE)
        self.held = getattr(self.holder, kind)(name)
        #: When each grant came and each release returned (the holder's first).
        self.grants: list[float] = []
        self.releases: list[float] = []
        self.errors: list[str] = []
        self.overlaps = 0
        self._inside = 0
        self._guard = threading.Lock()
        self.threads = [threading.Thread(target=self._wait, args=(c,)) for c in self.clients]

    def __enter__(self) -> Queue:
        try:
            assert self.held.acquire(timeout=10)
            for thread in self.threads:
                thread.start()
            # A fair lock's waiters queue in arrival order, a lock's in its waiting set.
            keys, count = self.held.keys, len(self.threads)
            waiters = keys.queue if isinstance(keys, FairKeys) else keys.waiters
            checker = self.holder.cluster
            assert checker is not None
            wait_until(lambda: checker.zcard(waiters) == count, 20, f"{count} waiters")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.held.hold_count():  # a failed test: let the waiters finish
            self.held.release()
        for thread in self.threads:
            if thread.ident is not None:
                thread.join(60)
        for client in {*self.clients, self.holder}:
            client.close()
        assert not any(thread.is_alive() for thread in self.threads), "a waiter hangs"

    def release(self) -> None:
        """The holder gives the lock back: the first waiter's turn."""
        self.held.release()
        with self._guard:
            self.releases.append(time.monotonic())

    def _wait(self, client: LockClient) -> None:
        lock = getattr(client, self.kind)(self.name)
        try:
            if not lock.acquire(timeout=40):
                self.errors.append("acquire timed out")
                return
            with self._guard:
                self.grants.append(time.monotonic())
                self._inside += 1
                self.overlaps += self._inside > 1
            time.sleep(0.01)
            with self._guard:
                self._inside -= 1
            lock.release()
            with self._guard:
                self.releases.append(time.monotonic())
        except Exception as error:  # noqa: BLE001 -- what escapes is the finding
            self.errors.append(_named(error))

    def wake_latencies(self) -> list[float]:
        """Seconds from each release to the grant after it (they alternate: no overlap)."""
        assert len(self.grants) == len(self.threads), self.errors
        pairs = zip(self.grants, self.releases[: len(self.grants)], strict=True)
        return [max(grant - released, 0.0) for grant, released in pairs]


@pytest.mark.parametrize("kind", ["lock", "fair_lock"])
@pytest.mark.parametrize("operation", ["reshard", "failover"])
def test_waiters_are_woken_through_a_slot_move(
    cluster_with_replicas: Cluster, operation: str, kind: str
) -> None:
    """The waiters' subscriptions, dropped by the node the slot leaves, follow it.

    The lock is held (its life: the watchdog's 10 s) while four waiters wait
    for it; the slot moves to another master (by hand, as a reshard does) or
    to its replica (``CLUSTER FAILOVER TAKEOVER``: see :func:`_failover`),
    which drops every subscription to the lock's channel on the old master.
    Then the holder releases: each waiter is granted in turn, promptly after
    the release before it, never a lock's life later; no error escapes, no two
    hold at once.
    """
    cluster = cluster_with_replicas
    name = f"queued-{operation}-{kind}"
    with Queue(cluster.url, name, kind) as queue:
        slot = slot_of(queue.held.keys.hash)
        if operation == "reshard":
            _move_slot_by_hand(cluster, slot, _owner_of(cluster, slot, cluster.nodes[0]))
        else:
            _failover(cluster, slot, takeover=True)  # the lock stays held throughout
        queue.release()
    assert not queue.errors, queue.errors
    assert queue.overlaps == 0
    latencies = queue.wake_latencies()
    assert max(latencies) < WAKE_BOUND, [round(latency, 3) for latency in latencies]


def test_a_subscription_refused_by_a_node_the_slot_left_is_made_on_its_owner(
    cluster_with_replicas: Cluster,
) -> None:
    """A client whose map still names the slot's old master: MOVED, then the owner.

    The node the slot left refuses the SSUBSCRIBE with MOVED; the waiter
    subscribes on the slot's owner instead, whose SPUBLISH then wakes it.
    """
    cluster = cluster_with_replicas
    with LockClient(cluster.url, key_prefix="test") as client:
        if not isinstance(client.listener, ShardedReleaseListener):
            pytest.skip("sharded pub/sub needs Redis >= 7")
        channel = client.lock("refused-subscription").keys.channel
        slot = slot_of(channel)
        source = _owner_of(cluster, slot, cluster.nodes[0])
        target = _start_moving(cluster, slot, source)
        _finish_moving(cluster, slot, source, target)
        assert client.cluster is not None
        manager = client.cluster.nodes_manager
        stale = manager.get_node(host="127.0.0.1", port=source.port)
        assert stale is not None
        manager.slots_cache[slot] = [stale]  # as a client that has not heard of the move yet
        with client.listener.listen(channel) as subscription:
            assert subscription.wait_subscribed(10)
            since = subscription.mark()
            publisher = target.client()
            try:
                assert publisher.execute_command("SPUBLISH", channel, "") == 1  # type: ignore[no-untyped-call, unused-ignore]
            finally:
                publisher.close()
            assert subscription.wait(since, 10)


#: The watchdog timeout of the renewal test: its rounds are 10 s apart, room
#: for a slot's move or a node's takeover to fall whole between two of them.
RENEWED_LIFE = 30


def test_renewals_follow_a_moved_slot_and_a_failed_over_node(
    cluster_with_replicas: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Holds in many slots while one slot moves, then another master is taken over.

    The renewal client's map still names the old owners: their MOVED replies
    make it read the map anew and send those batches again at once, to the
    new owner (a replica just promoted has never run the script: NOSCRIPT,
    and it is loaded there). So the first round after each operation renews
    every hold ("ok", never "failed"), no hold is lost, and nothing escapes
    the watchdog thread. Each operation falls between two rounds (checked).
    """
    cluster = cluster_with_replicas
    caplog.set_level(logging.WARNING, logger="django_rlock.watchdog")
    watchdog = get_watchdog()
    with (
        LockClient(cluster.url, key_prefix="test", watchdog_timeout=RENEWED_LIFE) as client,
        Renewals() as renewals,
    ):
        locks = [client.lock(f"renewed-through:{index}") for index in range(60)]
        slot = slot_of(locks[0].keys.hash)
        locks.append(client.lock(_name_in_slot(client, slot)))  # two holds in the moving slot
        for lock in locks:
            lock.acquire()
        source = _owner_of(cluster, slot, cluster.nodes[0])
        target = _owner_of(cluster, slot, cluster.nodes[0])

        def between_two_rounds(operation: Callable[[], object]) -> list[tuple[Hold, str]]:
            renewals.next_round(len(locks))  # one has just ended: 10 s to the next
            calls = watchdog.renewal_calls
            operation()
            assert watchdog.renewal_calls == calls, "a round began before the operation ended"
            return renewals.next_round(len(locks))

        def move() -> None:
            nonlocal target
            target = _move_slot_by_hand(cluster, slot, source)

        after_move = between_two_rounds(move)
        assert _owner_of(cluster, slot, cluster.nodes[0]) is target
        # The third master (neither the slot's old nor its new one) is taken over.
        held_slots = {slot_of(lock.keys.hash) for lock in locks}
        owners = {held: _owner_of(cluster, held, cluster.nodes[0]) for held in held_slots}
        other_slot, taken_over = next(
            (held, owner) for held, owner in owners.items() if owner not in (source, target)
        )
        wait_until(lambda: Cluster._synced(_replica_of(cluster, taken_over)), 20, "a replica")
        after_failover = between_two_rounds(lambda: _failover(cluster, other_slot, takeover=True))
        for outcomes in (after_move, after_failover):
            assert sorted(id(hold) for hold, _ in outcomes) == sorted(
                id(hold) for hold in client.watched_holds()
            )
            assert {outcome for _, outcome in outcomes} == {"ok"}
        assert not any(lock.lost for lock in locks)
        for lock in locks:
            lock.release()
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


#: The watchdog timeout of the silent master's test: rounds 4 s apart, and a
#: call's margin (2 s) longer than a loaded machine's takeover, as a rule.
SILENT_MASTER_LIFE = 12


def test_renewals_reach_the_replica_that_replaced_a_silent_master(
    cluster_with_replicas: Cluster,
) -> None:
    """A master stops (SIGSTOP); its replica takes over; no hold is lost.

    The stopped master answers nothing, not even MOVED (a paused one still
    redirects): its batches fail after the renewal socket timeout, the renewal
    client reads the slot map anew from the other nodes, and the next round
    reaches the new master. Sent to the old master round after round, the
    holds it served would all be lost.
    """
    cluster = cluster_with_replicas
    with (
        LockClient(cluster.url, key_prefix="test", watchdog_timeout=SILENT_MASTER_LIFE) as client,
        Renewals() as renewals,
    ):
        locks = held_locks(client, "silent-master", 30)
        slot = slot_of(locks[0].keys.hash)
        master = _owner_of(cluster, slot, cluster.nodes[0])
        wait_until(lambda: Cluster._synced(_replica_of(cluster, master)), 20, "a replica in sync")
        replica = _replica_of(cluster, master)
        on_master = {
            lock.keys.hash
            for lock in locks
            if _owner_of(cluster, slot_of(lock.keys.hash), cluster.nodes[0]) is master
        }
        renewals.next_round(len(locks))
        assert _command(master, "WAIT", "1", "10000") == 1  # the replica has every hold
        assert master.process is not None
        master.process.send_signal(signal.SIGSTOP)
        try:
            _command(replica, "CLUSTER", "FAILOVER", "TAKEOVER")
            wait_until(lambda: _owner_of(cluster, slot, replica) is replica, 20, "the takeover")
            taken_over = len(renewals.outcomes)
            time.sleep(SILENT_MASTER_LIFE + 2)  # longer than a hold lives unrenewed
            assert not [lock.name for lock in locks if lock.lost]
            after = renewals.outcomes[taken_over:]
            renewed = {hold.key for hold, outcome in after if outcome == "ok"}
            assert on_master <= renewed  # by the new master: the old one answers nothing
        finally:
            master.process.send_signal(signal.SIGCONT)
        wait_until(lambda: not _is_master(master), 30, "the old master stepping down")
        for lock in locks:
            lock.release()
