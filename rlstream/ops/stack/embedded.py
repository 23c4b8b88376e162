"""The embedded default stack: a broker (Tansu, or Apache Kafka in KRaft mode: one node or
three) and SeaweedFS (S3) as child processes on free loopback ports, Qdrant embedded
(qdrant-edge), all state under one directory.

The broker is `broker=` (`rlstream stack up --broker`), else $RLSTREAM_STACK_BROKER, else
Tansu; Kafka's node count is `nodes=` (`--nodes`), else $RLSTREAM_STACK_NODES, else 1.

`up()` starts a detached supervisor process (`python -m rlstream.ops.stack.embedded`) that owns the
servers: they are spawned with a parent-death signal, so a crashed or SIGKILLed supervisor
takes them down with it, and SIGTERM/SIGINT stops them cleanly. `EmbeddedStack` is the same
thing in-process, for commands such as `rlstream run` that bring the stack up and down themselves.

Files under the state directory: endpoints.json (what other commands read), stack.json (pids,
ports, start times), secrets.json (the S3 keys, kept across restarts for durable data), logs/,
s3/ (SeaweedFS data), qdrant/ (one embedded shard per collection).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from rlstream.connectors.endpoints import Endpoints, setting_from_env
from rlstream.ops.stack import kafka, procs
from rlstream.ops.stack.procs import StackError, tansu_binary, weed_binary

STACK_FILE = "stack.json"
BUCKET = "rlstream"
TANSU_BUCKET = "tansu"
PROMETHEUS_INTERVAL = "2s"  # scrape and rule evaluation: a loopback stack is small


@dataclass
class Server:
    name: str
    pid: int
    port: int
    started_at: float
    log: str
    ports: list[int] = field(default_factory=list)


VACUUM_EVERY_S = 120
"""SeaweedFS compacts a volume whose deleted share passed its threshold this often: on the
2,000-step soak the S3 data directory grew 640 MiB per 1,000 steps at its default (14 min)
while the live objects held 225 MiB."""


def _secrets(directory: Path) -> dict[str, str]:
    path = directory / "secrets.json"
    keys = json.loads(path.read_text()) if path.exists() else {}
    if {"access_key", "secret_key", "kafka_password", "tls_password"} <= set(keys):
        return keys
    made = {"access_key": "rlstream-" + secrets.token_hex(4), "secret_key": secrets.token_hex(20),
            "kafka_password": secrets.token_hex(16),
            "tls_password": secrets.token_hex(16)}  # fmt: skip
    keys = made | keys
    path.write_text(json.dumps(keys))
    path.chmod(0o600)
    return keys


BROKERS = ("tansu", "kafka")


def broker_choice(
    broker: str | None = None, nodes: int | None = None, directory: Path | None = None
) -> tuple[str, int]:
    """The stack's broker and node count: the arguments, else the environment, else what the
    stack in `directory` was made with (a Kafka cluster keeps its nodes' storage there), else
    Tansu."""
    import os

    made = directory is not None and (Path(directory) / "kafka" / "cluster.id").is_file()
    broker = broker or os.environ.get("RLSTREAM_STACK_BROKER") or ("kafka" if made else "tansu")
    if not nodes and not os.environ.get("RLSTREAM_STACK_NODES") and made and broker == "kafka":
        nodes = len(list((Path(directory) / "kafka").glob("node-*"))) or None
    nodes = nodes or int(os.environ.get("RLSTREAM_STACK_NODES") or 1)
    if broker not in BROKERS:
        raise StackError(f"broker {broker!r}: choose tansu or kafka (RLSTREAM_STACK_BROKER)")
    if nodes not in (1, 3) or (broker == "tansu" and nodes != 1):
        raise StackError(f"nodes {nodes}: Kafka runs 1 or 3 nodes, Tansu 1")
    return broker, nodes


class EmbeddedStack:
    """Start and stop the servers of one state directory from this process."""

    def __init__(
        self,
        directory: Path,
        *,
        durable: bool = False,
        prometheus: bool = False,
        broker: str | None = None,
        nodes: int | None = None,
        sasl: bool = False,
        tls: bool = False,
    ):
        self.directory = Path(directory).resolve()
        self.durable, self.prometheus = durable, prometheus
        self.broker, self.nodes = broker_choice(broker, nodes, self.directory)
        if sasl and self.broker != "kafka":
            raise StackError("--sasl: clients authenticate with SCRAM on Apache Kafka only "
                             "(--broker kafka); Tansu's SCRAM cannot hold users")  # fmt: skip
        if tls and self.broker != "kafka":
            raise StackError("--tls: the TLS listener runs on Apache Kafka only (--broker kafka)")
        self.sasl, self.tls = sasl, tls
        self.servers: list[Server] = []
        self._procs: list[subprocess.Popen] = []
        self._commands: dict[str, tuple[list[str], dict[str, str]]] = {}
        self.endpoints: Endpoints | None = None

    def start(self, timeout_s: float = 60.0) -> Endpoints:
        self.directory.mkdir(parents=True, exist_ok=True)
        keys = _secrets(self.directory)
        try:
            s3_port = self._start_weed(keys, timeout_s)
            endpoints = Endpoints(
                kafka_bootstrap="",
                s3_endpoint=f"127.0.0.1:{s3_port}",
                s3_access_key=keys["access_key"],
                s3_secret_key=keys["secret_key"],
                s3_bucket=BUCKET,
                qdrant_path=str(self.directory / "qdrant"),
            )
            _make_buckets(endpoints, [BUCKET, TANSU_BUCKET] if self.durable else [BUCKET])
            if self.broker == "kafka":
                if self.sasl:  # SCRAM-SHA-256 as kafka.SCRAM_USER, the password kept with the keys
                    password = keys["kafka_password"]
                    endpoints = replace(endpoints, kafka_sasl_mechanism=kafka.SCRAM_MECHANISM,
                                        kafka_username=kafka.SCRAM_USER,
                                        kafka_password=password)  # fmt: skip
                tls = None
                if self.tls:  # the stack's own CA, its certificate beside the brokers' data
                    try:
                        tls = kafka.make_certificates(self.directory / "kafka" / "tls",
                                                      keys["tls_password"])  # fmt: skip
                    except kafka.KafkaInstallError as exc:
                        raise StackError(str(exc)) from None
                    endpoints = replace(endpoints, kafka_ssl_cafile=str(tls.ca))
                protocol = kafka.client_protocol(self.sasl, self.tls)
                endpoints = replace(endpoints, kafka_security_protocol=protocol)
                bootstrap = self._start_kafka(endpoints, tls, timeout_s)
                factor, _ = kafka.replication(self.nodes)
            else:
                bootstrap, factor = (
                    f"127.0.0.1:{self._start_tansu(endpoints, s3_port, timeout_s)}",
                    1,
                )
            endpoints = replace(endpoints, kafka_bootstrap=bootstrap, broker=self.broker,
                                replication_factor=factor,
                                retention_mb=setting_from_env("retention_mb", 512))  # fmt: skip
            from rlstream.connectors.kafka import ensure_topics

            asyncio.run(ensure_topics(endpoints))
            (self.directory / "qdrant").mkdir(exist_ok=True)
            if self.prometheus:
                url, targets = self._start_prometheus(timeout_s)
                endpoints = replace(endpoints, prometheus_url=url, prometheus_targets=targets)
        except BaseException:
            self.stop()
            raise
        self.endpoints = endpoints
        return endpoints

    def _start_weed(self, keys: dict[str, str], timeout_s: float) -> int:
        (s3, s3g, master, masterg, vol, volg, filer, filerg, admin, adming) = procs.free_ports(10)
        data = self.directory / "s3"
        data.mkdir(exist_ok=True)
        cmd = [
            weed_binary(), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-s3.port={s3}", f"-s3.port.grpc={s3g}", f"-master.port={master}",
            f"-master.port.grpc={masterg}", f"-volume.port={vol}", f"-volume.port.grpc={volg}",
            f"-filer.port={filer}", f"-filer.port.grpc={filerg}", f"-admin.port={admin}",
            f"-admin.port.grpc={adming}", "-admin.ui=false", "-webdav=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            # reclaim what deleted objects held (checkpoints and policy versions are replaced
            # as a run goes): every 2 min past 10% garbage, not every 14 min past 30%
            f"-master.vacuumIntervalSeconds={VACUUM_EVERY_S}", "-master.garbageThreshold=0.1",
        ]  # fmt: skip
        env = {"AWS_ACCESS_KEY_ID": keys["access_key"], "AWS_SECRET_ACCESS_KEY": keys["secret_key"]}
        log = self.directory / "logs" / "seaweedfs.log"
        proc = self._spawn("seaweedfs", cmd, s3, log, env, [s3, master, vol, filer])
        if not procs.wait_until(lambda: procs.port_open(s3) or proc.poll() is not None, timeout_s):
            raise StackError(f"SeaweedFS did not open port {s3} in {timeout_s:.0f}s")
        if proc.poll() is not None:
            raise StackError(f"SeaweedFS exited with {proc.returncode}:\n{procs.tail_text(log)}")
        return s3

    def _start_tansu(self, endpoints: Endpoints, s3_port: int, timeout_s: float) -> int:
        (port,) = procs.free_ports(1)
        url = f"tcp://127.0.0.1:{port}"
        cmd = [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url]
        env = {}
        if self.durable:
            cmd += ["--storage-engine", f"s3://{TANSU_BUCKET}/"]
            env = {
                "AWS_ACCESS_KEY_ID": endpoints.s3_access_key,
                "AWS_SECRET_ACCESS_KEY": endpoints.s3_secret_key,
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ENDPOINT": f"http://127.0.0.1:{s3_port}",
                "AWS_ALLOW_HTTP": "true",
            }
        log = self.directory / "logs" / "tansu.log"
        proc = self._spawn("tansu", cmd, port, log, env, [port])
        if not procs.wait_until(
            lambda: procs.port_open(port) or proc.poll() is not None, timeout_s
        ):
            raise StackError(f"Tansu did not open port {port} in {timeout_s:.0f}s")
        if proc.poll() is not None:
            raise StackError(f"Tansu exited with {proc.returncode}:\n{procs.tail_text(log)}")
        return port

    def _start_kafka(self, endpoints: Endpoints, tls: kafka.Tls | None, timeout_s: float) -> str:
        """Apache Kafka's nodes (their jars fetched from Maven Central the first time); returns
        the bootstrap servers once every node serves metadata."""
        ports = procs.free_ports(2 * self.nodes)
        pairs = list(zip(ports[::2], ports[1::2], strict=True))
        try:
            nodes, commands = kafka.prepare(self.directory / "kafka", pairs,
                                            endpoints.kafka_password, tls)  # fmt: skip
        except kafka.KafkaInstallError as exc:
            raise StackError(str(exc)) from None
        for node, cmd in zip(nodes, commands, strict=True):
            log = self.directory / "logs" / f"kafka-{node.node_id}.log"
            self._spawn(f"kafka-{node.node_id}", cmd, node.port, log, {},
                        [node.port, node.controller_port])  # fmt: skip
        bootstrap = ",".join(f"127.0.0.1:{n.port}" for n in nodes)
        servers = self.servers[-len(nodes) :]
        procs_ = self._procs[-len(nodes) :]

        def up() -> bool:
            return all(procs.port_open(s.port) for s in servers) or any(
                p.poll() is not None for p in procs_
            )

        if not procs.wait_until(up, timeout_s) or any(p.poll() is not None for p in procs_):
            logs = "\n".join(procs.tail_text(Path(s.log)) for s in servers)
            raise StackError(f"Kafka did not start in {timeout_s:.0f}s:\n{logs}")
        from rlstream.connectors.kafka import wait_for_brokers

        asyncio.run(wait_for_brokers(bootstrap, len(nodes), timeout_s, **endpoints.kafka_auth()))
        return bootstrap

    def _start_prometheus(self, timeout_s: float) -> tuple[str, str]:
        """Prometheus (Debian's package) scraping the file_sd targets runs write, with the
        alert rules loaded; returns (its URL, the targets directory)."""
        binary = shutil.which("prometheus")
        if binary is None:
            raise StackError("no `prometheus` binary: `apt-get install prometheus` (Debian)")
        home = self.directory / "prometheus"
        targets = home / "targets"
        targets.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(resources.files("rlstream") / "ops" / "alerts.yml", home / "alerts.yml")
        every = PROMETHEUS_INTERVAL
        config = {
            "global": {"scrape_interval": every, "evaluation_interval": every},
            "rule_files": ["alerts.yml"],
            "scrape_configs": [{"job_name": "rlstream", "file_sd_configs": [
                {"files": [str(targets / "*.json")], "refresh_interval": every}]}],
        }  # fmt: skip
        (home / "prometheus.yml").write_text(json.dumps(config, indent=2))  # YAML reads JSON
        (port,) = procs.free_ports(1)
        cmd = [binary, f"--config.file={home / 'prometheus.yml'}",
               f"--storage.tsdb.path={home / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
               "--storage.tsdb.retention.time=2d"]  # fmt: skip
        log = self.directory / "logs" / "prometheus.log"
        proc = self._spawn("prometheus", cmd, port, log, {}, [port])
        url = f"http://127.0.0.1:{port}"
        if not procs.wait_until(lambda: _ready(url) or proc.poll() is not None, timeout_s):
            raise StackError(f"Prometheus was not ready on port {port} in {timeout_s:.0f}s")
        if proc.poll() is not None:
            raise StackError(f"Prometheus exited with {proc.returncode}:\n{procs.tail_text(log)}")
        return url, str(targets)

    def _spawn(self, name, cmd, port, log, env, ports) -> subprocess.Popen:
        proc = procs.spawn(cmd, log=log, env=env, own_group=True)
        self._procs.append(proc)
        self._commands[name] = (cmd, env)
        self.servers.append(Server(name, proc.pid, port, time.time(), str(log), ports))
        return proc

    def stop_server(self, name: str) -> None:
        """Stop one server (its data stays), as an outage would; `start_server` brings it back."""
        i = self._index(name)
        procs.terminate(self.servers[i].pid)
        self._procs[i].wait(timeout=10)

    def kill_server(self, name: str) -> None:
        """SIGKILL one server, as a crash would (what it had not written is gone)."""
        i = self._index(name)
        self._procs[i].kill()
        self._procs[i].wait(timeout=10)

    def start_server(self, name: str, timeout_s: float = 60.0) -> None:
        """Start a stopped server again with its command, ports and data."""
        self.start_servers([name], timeout_s)

    def start_servers(self, names: list[str], timeout_s: float = 60.0) -> None:
        """Start stopped servers together, then wait for each (a KRaft node opens its client
        port only once a quorum of controllers answers: the nodes of a cluster come back
        together or not at all)."""
        started = []
        for name in names:
            i = self._index(name)
            server, (cmd, env) = self.servers[i], self._commands[name]
            proc = procs.spawn(cmd, log=Path(server.log), env=env, own_group=True)
            self._procs[i] = proc
            self.servers[i] = replace(server, pid=proc.pid, started_at=time.time())
            started.append((name, self.servers[i], proc))
        for name, server, proc in started:
            opened = lambda s=server, p=proc: procs.port_open(s.port) or p.poll() is not None  # noqa: E731
            if not procs.wait_until(opened, timeout_s) or proc.poll() is not None:
                raise StackError(f"{name} did not come back:\n{procs.tail_text(Path(server.log))}")

    def broker_servers(self) -> list[str]:
        """The names of the broker's servers: `tansu`, or every Kafka node (`kafka-N`)."""
        return [s.name for s in self.servers if s.name == "tansu" or s.name.startswith("kafka-")]

    def _index(self, name: str) -> int:
        names = [s.name for s in self.servers]
        if name not in names:
            raise StackError(f"no server {name!r} in this stack (it has {', '.join(names)})")
        return names.index(name)

    def dead_servers(self) -> list[str]:
        return [
            s.name for s, p in zip(self.servers, self._procs, strict=True) if p.poll() is not None
        ]

    def stop(self) -> None:
        """Stop the other servers together first (a durable broker writes to the S3 server
        until it exits), then the S3 server."""
        procs.terminate_all([s.pid for s in self.servers if s.name != "seaweedfs"])
        procs.terminate_all([s.pid for s in self.servers if s.name == "seaweedfs"])
        for proc in self._procs:
            proc.wait(timeout=10)
        self.servers.clear()
        self._procs.clear()

    def __enter__(self) -> EmbeddedStack:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _ready(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def _make_buckets(endpoints: Endpoints, buckets: list[str], timeout_s: float = 30.0) -> None:
    from rlstream.connectors.objectstore import ObjectStore

    deadline = time.monotonic() + timeout_s
    for bucket in buckets:
        while True:
            try:
                ObjectStore(endpoints, bucket).ensure_bucket()
                break
            except Exception as exc:  # noqa: BLE001  (the S3 API comes up after the port opens)
                if time.monotonic() > deadline:
                    raise StackError(f"S3 server not ready after {timeout_s:.0f}s: {exc}") from exc
                time.sleep(0.2)
