"""A renewal round on a Redis Cluster: each node's batches as one pipeline, the nodes at once.

One EVAL may only touch keys of one slot, so the watchdog renews a cluster
client's holds in per-slot batches (:func:`~django_rlock.core._sync.sharding.slot_of`).
Sent one after another, they cost one round trip per slot held: a process
holding locks in 1,000 slots paid 1,000 round trips per interval, and a round
could outlast the interval. :meth:`NodeRounds.run` groups the batches by the
primary serving their slot in the cluster client's map and sends each node's
EVALSHAs as one non-transactional pipeline on that node's connection: a round
costs one round trip per node. The nodes are sent to at once (the first on
the calling thread, each other one on a short-lived thread of its own), so a
node that hangs delays no other node's renewals, and the round ends within the
renewal socket timeout (``limit``): a node with no reply by then has its
batches fail with a ``TimeoutError``, as one EVAL's socket timeout would.

Each batch keeps its own outcome, its reply or the error it met, as if it had
been sent alone:

* an error reply (MOVED or ASK when its slot moved, TRYAGAIN, CLUSTERDOWN, an
  ACL refusal) is that batch's alone;
* a node that cannot be reached fails its own batches only;
* NOSCRIPT (a node that never ran the script: restarted, flushed, or a replica
  just promoted by a failover): the first such batch is sent through the
  script object, which loads the script and runs it (choosing the
  ``allow-oom`` variant the server compiles), then the others again as one
  pipeline;
* a slot the map gives to no node fails its batch (``SlotNotCoveredError``).

A MOVED reply says the map is stale; a node that cannot be reached or gives no
reply in time, a CLUSTERDOWN and a slot the map gives to no node say it may be
(a master down is replaced by its replica). The batches sent here never go
through the cluster client, which would read the map anew itself: after such a
round the watchdog calls :meth:`NodeRounds.refresh_map`, once the round's
outcomes are settled, and then sends the moved batches again, to the slot's new
node (see :mod:`~django_rlock.core._sync.watchdog`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import (
    ClusterDownError,
    MovedError,
    NoScriptError,
    ResponseError,
    SlotNotCoveredError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from django_rlock.core._protocol import clock
from django_rlock.core._protocol.calls import ScriptCall
from django_rlock.core._protocol.refusals import permission_error
from django_rlock.core._sync.sharding import slot_of

logger = logging.getLogger("django_rlock.watchdog")

#: The outcomes after which the client's slot map may no longer be the cluster's.
_MAP_MAY_BE_STALE = (
    MovedError,
    RedisConnectionError,
    RedisTimeoutError,
    ClusterDownError,
    SlotNotCoveredError,
)


class NodeRounds:
    """Sends many single-slot script calls with one pipeline per cluster node, the nodes at once.

    ``cluster`` is the renewal client (no retries, the renewal socket timeouts);
    ``limit`` the longest a round may take, in seconds (its socket timeout).
    """

    def __init__(self, cluster: RedisCluster, limit: float) -> None:
        self._cluster = cluster
        self._limit = limit
        # Whether a call since the last refresh met a sign the map is stale.
        self._stale = False

    def run(self, script: Any, calls: Sequence[ScriptCall]) -> list[Any]:
        """Run ``script`` with each call (each within one slot); per call its reply or its error.

        ``script`` is a :class:`~django_rlock.core._sync.scripts.LockScript` or
        :class:`~django_rlock.core._sync.scripts.OomSafeScript`: its ``sha`` is
        sent, and it loads itself where a node answers NOSCRIPT. An error is
        returned in its call's place, never raised.
        """
        outcomes: list[Any] = [None] * len(calls)
        groups: dict[str, tuple[ClusterNode, list[int]]] = {}
        manager = self._cluster.nodes_manager
        for index, call in enumerate(calls):
            try:
                node = manager.get_node_from_slot(slot_of(call.keys[0]))
            except Exception as error:  # noqa: BLE001 -- no node for the slot (SlotNotCoveredError): this call's
                outcomes[index] = error
                continue
            groups.setdefault(node.name, (node, []))[1].append(index)
        started = clock.monotonic()
        sending: list[tuple[threading.Thread, list[int], list[Any]]] = []
        nodes = list(groups.values())
        for node, indexes in nodes[1:]:
            replies: list[Any] = []
            node_calls = [calls[index] for index in indexes]
            thread = threading.Thread(
                target=self._send_into,
                args=(replies, script, node, node_calls),
                name="rlock-watchdog-node",
                daemon=True,
            )
            try:
                thread.start()
            except RuntimeError:  # no new threads (the interpreter is shutting down): in turn
                self._send_into(replies, script, node, node_calls)
            sending.append((thread, indexes, replies))
        if nodes:
            node, indexes = nodes[0]
            replies = self._send_node(script, node, [calls[index] for index in indexes])
            for index, reply in zip(indexes, replies, strict=True):
                outcomes[index] = reply
        for thread, indexes, replies in sending:
            if thread.ident is not None:
                thread.join(max(started + self._limit - clock.monotonic(), 0.0))
            if thread.is_alive():
                # Still waiting for its node: counted as no reply in time. Its
                # socket timeout ends the thread soon; what it reads then is dropped.
                late = RedisTimeoutError(f"no reply within {self._limit:g}s")
                for index in indexes:
                    outcomes[index] = late
                continue
            for index, reply in zip(indexes, replies, strict=True):
                outcomes[index] = reply
        if any(isinstance(outcome, _MAP_MAY_BE_STALE) for outcome in outcomes):
            self._stale = True
        return outcomes

    def _send_into(
        self, replies: list[Any], script: Any, node: ClusterNode, calls: list[ScriptCall]
    ) -> None:
        replies.extend(self._send_node(script, node, calls))

    def _send_node(self, script: Any, node: ClusterNode, calls: list[ScriptCall]) -> list[Any]:
        """``calls`` on ``node``: one pipeline, NOSCRIPT answered by loading; never raises."""
        try:
            client = self._cluster.get_redis_connection(node)
            outcomes = _pipeline(client, script.sha, calls)
            missing = [index for index, reply in enumerate(outcomes) if _no_script(reply)]
            if missing:
                first, *others = missing
                outcomes[first] = _run_one(script, client, calls[first])  # loads the script
                if others:
                    again = _pipeline(client, script.sha, [calls[index] for index in others])
                    for index, reply in zip(others, again, strict=True):
                        outcomes[index] = reply
        except Exception as error:  # noqa: BLE001 -- the node failed: each of its calls reports it
            return [error] * len(calls)
        return outcomes

    def refresh_map(self) -> None:
        """Read the cluster's slot map anew if a call met a sign it is stale since the last time.

        Bounded by the renewal connections' timeouts; a failed read leaves the
        map as it was, and the next round that meets the same asks again.
        """
        if not self._stale:
            return
        self._stale = False
        try:
            self._cluster.nodes_manager.initialize()
        except Exception as error:  # noqa: BLE001 -- the map as it was; the next round asks again
            logger.debug("watchdog: cluster slot map refresh failed: %s", error)


def _pipeline(client: Any, sha: str, calls: Sequence[ScriptCall]) -> list[Any]:
    """EVALSHA ``sha`` with each call, one pipeline (one round trip); per call a reply or error."""
    pipe = client.pipeline(transaction=False)
    for call in calls:
        pipe.execute_command("EVALSHA", sha, len(call.keys), *call.keys, *call.args)
    replies: list[Any] = pipe.execute(raise_on_error=False)
    return [_refusal(reply) if isinstance(reply, ResponseError) else reply for reply in replies]


def _run_one(script: Any, client: Any, call: ScriptCall) -> Any:
    try:
        return script(keys=call.keys, args=call.args, client=client)
    except Exception as error:  # noqa: BLE001 -- this call's outcome
        return error


def _no_script(reply: Any) -> bool:
    return isinstance(reply, NoScriptError)


def _refusal(error: ResponseError) -> ResponseError:
    """An ACL refusal inside the script made clear, as the script object does alone."""
    return permission_error(error) or error
