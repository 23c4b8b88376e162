"""Apache Kafka in KRaft mode from the project's own install: one combined broker/controller, or
three nodes (replication factor 3, min ISR 2), on loopback ports, state under the stack's
directory.

The jars come from Maven Central (`org.apache.kafka:kafka_2.13`, its dependencies and a log4j2
binding) through `mvn dependency:copy-dependencies` into a cache directory, once; every start
after that is offline. Each node is `java -Xmx<heap> -cp <jars> kafka.Kafka server.properties`
with storage formatted for the cluster's id the first time (`kafka.tools.StorageTool`).
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

KAFKA_VERSION = "4.1.0"
LOG4J_VERSION = "2.24.3"
HEAP = os.environ.get("RLSTREAM_KAFKA_HEAP", "512m")
"""Each node's JVM heap (-Xmx); the start scripts' default is 1G, a loopback stack needs less."""

POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>rlstream</groupId><artifactId>kafka-broker</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version></dependency>
  </dependencies>
</project>
"""

LOG4J2 = """Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: kafka.server.KafkaServer
        level: INFO
      - name: kafka.server.KafkaRaftServer
        level: INFO
"""


class KafkaInstallError(RuntimeError):
    """Java or Maven is missing, or Maven could not fetch the broker; the message says what
    to do."""


def cache_dir() -> Path:
    """Where the broker's jars are kept: $RLSTREAM_CACHE, else ~/.cache/rlstream."""
    root = os.environ.get("RLSTREAM_CACHE") or Path.home() / ".cache" / "rlstream"
    return Path(root) / f"kafka-{KAFKA_VERSION}"


def java_binary() -> str:
    found = shutil.which("java")
    if found is None:
        raise KafkaInstallError(
            "Apache Kafka needs Java 17 or newer: apt-get install openjdk-17-jre-headless"
        )
    return found


def classpath() -> str:
    """The broker's classpath, fetching the jars from Maven Central the first time."""
    libs = cache_dir() / "libs"
    if not (libs / f"kafka_2.13-{KAFKA_VERSION}.jar").is_file():
        fetch_jars(libs)
    return f"{libs}/*"


def fetch_jars(libs: Path) -> None:
    java_binary()
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaInstallError("fetching Apache Kafka needs Maven: apt-get install maven")
    work = libs.parent / "fetch"
    work.mkdir(parents=True, exist_ok=True)
    (work / "pom.xml").write_text(POM.format(kafka=KAFKA_VERSION, log4j=LOG4J_VERSION))
    partial = libs.with_name("libs.partial")
    shutil.rmtree(partial, ignore_errors=True)
    cmd = [mvn, "-q", "-B", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
           f"-DoutputDirectory={partial}", "-DincludeScope=runtime"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise KafkaInstallError(
            f"mvn could not fetch org.apache.kafka:kafka_2.13:{KAFKA_VERSION}: " + " / ".join(tail)
        )
    shutil.rmtree(libs, ignore_errors=True)
    partial.rename(libs)  # whole or not at all: an interrupted fetch is fetched again


@dataclass(frozen=True)
class Node:
    node_id: int
    port: int  # clients (PLAINTEXT, or SASL / TLS)
    controller_port: int
    directory: Path


def cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding, never starting
    with '-' (as Kafka's own ids: one in 64 did, and `kafka-storage format -t -Qo6...` read it
    as an option; CI's fresh stacks failed to format)."""
    while True:
        made = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not made.startswith("-"):
            return made


def replication(nodes: int) -> tuple[int, int]:
    """(replication factor, min in-sync replicas) for a cluster of `nodes`: 1/1, or 3/2."""
    factor = min(3, nodes)
    return factor, max(1, factor - 1)


SCRAM_USER = "rlstream"
SCRAM_MECHANISM = "SCRAM-SHA-256"


@dataclass(frozen=True)
class Tls:
    """The stack's TLS material: the brokers' keystore (PKCS12, its key signed by the stack's
    own CA) and the CA's certificate, which clients verify the brokers with."""

    keystore: Path
    password: str
    ca: Path


def keytool() -> str:
    return str(Path(java_binary()).resolve().with_name("keytool"))


def make_certificates(directory: Path, password: str) -> Tls:
    """A CA and a broker certificate for 127.0.0.1 and localhost, signed by it, with the JDK's
    keytool (once: a restarted stack keeps them, so clients keep trusting its CA)."""
    tls = Tls(directory / "broker.p12", password, directory / "ca.pem")
    if tls.keystore.is_file() and tls.ca.is_file():
        return tls
    directory.mkdir(parents=True, exist_ok=True)
    ca_store, csr, signed = directory / "ca.p12", directory / "broker.csr", directory / "broker.pem"
    for path in (ca_store, tls.keystore):
        path.unlink(missing_ok=True)
    store = ["-storetype", "PKCS12", "-storepass", password]
    names = "SAN=ip:127.0.0.1,dns:localhost"
    steps = [
        ["-genkeypair", "-alias", "ca", "-dname", "CN=rlstream stack CA", "-ext", "bc:c",
         "-keyalg", "RSA", "-keysize", "2048", "-validity", "3650", "-keystore", ca_store],
        ["-exportcert", "-rfc", "-alias", "ca", "-keystore", ca_store, "-file", tls.ca],
        ["-genkeypair", "-alias", "broker", "-dname", "CN=127.0.0.1", "-ext", names,
         "-keyalg", "RSA", "-keysize", "2048", "-validity", "3650", "-keystore", tls.keystore],
        ["-certreq", "-alias", "broker", "-keystore", tls.keystore, "-file", csr],
        ["-gencert", "-rfc", "-alias", "ca", "-keystore", ca_store, "-infile", csr,
         "-outfile", signed, "-ext", names, "-validity", "3650"],
        ["-importcert", "-noprompt", "-alias", "ca", "-file", tls.ca, "-keystore", tls.keystore],
        ["-importcert", "-alias", "broker", "-file", signed, "-keystore", tls.keystore],
    ]  # fmt: skip
    for step in steps:
        done = subprocess.run([keytool(), *map(str, step), *store], capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        if done.returncode != 0:
            raise KafkaInstallError(
                f"keytool {step[0]} failed: {(done.stdout + done.stderr)[-300:]}"
            )
    for path in (ca_store, tls.keystore):
        path.chmod(0o600)  # the private keys
    csr.unlink()
    return tls


def client_protocol(sasl: bool, tls: bool) -> str:
    """The clients' listener: PLAINTEXT, SASL_PLAINTEXT, SSL or SASL_SSL."""
    return {(False, False): "PLAINTEXT", (True, False): "SASL_PLAINTEXT",
            (False, True): "SSL", (True, True): "SASL_SSL"}[(sasl, tls)]  # fmt: skip


def server_properties(
    node: Node, voters: list[Node], scram_password: str | None = None, tls: Tls | None = None
) -> str:
    """One node's configuration: broker and controller combined, loopback listeners, internal
    topics replicated like the data topics, no auto-created topics (rlstream creates its topics
    with their final partition counts), group joins without the initial rebalance delay. With
    `scram_password`, clients and brokers authenticate with SCRAM-SHA-256 as `SCRAM_USER`; with
    `tls`, they speak TLS to the brokers, which present the stack CA's certificate (the
    controllers talk PLAINTEXT among themselves, on loopback)."""
    factor, min_isr = replication(len(voters))
    quorum = ",".join(f"{v.node_id}@127.0.0.1:{v.controller_port}" for v in voters)
    protocol = client_protocol(scram_password is not None, tls is not None)
    listener = f"{protocol}://127.0.0.1:{node.port}"
    props = {
        "process.roles": "broker,controller",
        "node.id": node.node_id,
        "controller.quorum.voters": quorum,  # a static quorum: the nodes never change
        "listeners": f"{listener},CONTROLLER://127.0.0.1:{node.controller_port}",
        "advertised.listeners": listener,
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": protocol,
        "listener.security.protocol.map": f"{protocol}:{protocol},CONTROLLER:PLAINTEXT",
        "log.dirs": node.directory / "data",
        "num.partitions": 4,
        "default.replication.factor": factor,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": factor,
        "transaction.state.log.replication.factor": factor,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": factor,
        "share.coordinator.state.topic.min.isr": min_isr,
        "group.initial.rebalance.delay.ms": 0,
        "auto.create.topics.enable": "false",
        "log.retention.check.interval.ms": 30_000,
        # a node that stops heartbeating is fenced, and its partitions get new leaders, after
        # 3 s (the default 9 s: a killed leader's partitions would wait that long on loopback)
        "broker.session.timeout.ms": 3_000,
        "broker.heartbeat.interval.ms": 500,
    }
    if scram_password is not None:
        login = ("org.apache.kafka.common.security.scram.ScramLoginModule required "
                 f'username="{SCRAM_USER}" password="{scram_password}";')  # fmt: skip
        props |= {
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
            f"listener.name.{protocol.lower()}.scram-sha-256.sasl.jaas.config": login,
        }
    if tls is not None:
        props |= {
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": tls.keystore,
            "ssl.keystore.password": tls.password,
            "ssl.key.password": tls.password,
            "ssl.truststore.type": "PEM",  # the brokers verify each other with the stack's CA
            "ssl.truststore.location": tls.ca,
        }
    return "".join(f"{k}={v}\n" for k, v in props.items())


def format_storage(node: Node, cluster: str, scram_password: str | None = None) -> list[str]:
    """The command that formats a node's storage (once: a formatted node keeps its data), with
    the SCRAM user's credentials in the metadata when there is a password."""
    config = str(node.directory / "server.properties")
    # `--cluster-id=ID`: an id a stack made before the fix may start with '-'
    cmd = [java_binary(), "-cp", classpath(), "kafka.tools.StorageTool", "format",
           f"--cluster-id={cluster}", "-c", config, "--ignore-formatted"]  # fmt: skip
    if scram_password is not None:
        cmd += ["--add-scram", f"{SCRAM_MECHANISM}=[name={SCRAM_USER},password={scram_password}]"]
    return cmd


def prepare(
    directory: Path,
    ports: list[tuple[int, int]],
    scram_password: str | None = None,
    tls: Tls | None = None,
) -> tuple[list[Node], list[list[str]]]:
    """The cluster's nodes under `directory` (node-1, node-2, ...) with their configuration
    written and storage formatted; returns the nodes and each node's start command. The
    cluster id is kept in `directory/cluster.id`, so a restarted stack finds its data."""
    directory.mkdir(parents=True, exist_ok=True)
    id_file = directory / "cluster.id"
    if not id_file.exists():
        id_file.write_text(cluster_id())
    cluster = id_file.read_text().strip()
    nodes = [Node(i + 1, p, c, directory / f"node-{i + 1}") for i, (p, c) in enumerate(ports)]
    log4j = directory / "log4j2.yaml"
    log4j.write_text(LOG4J2)
    commands = []
    for node in nodes:
        node.directory.mkdir(parents=True, exist_ok=True)
        config = server_properties(node, nodes, scram_password, tls)
        (node.directory / "server.properties").write_text(config)
        (node.directory / "server.properties").chmod(0o600)  # it holds the passwords
        done = subprocess.run(format_storage(node, cluster, scram_password), capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        if done.returncode != 0:
            raise KafkaInstallError(f"formatting Kafka node {node.node_id} failed: "
                                    f"{(done.stdout + done.stderr).strip()[-400:]}")  # fmt: skip
        commands.append([java_binary(), f"-Xmx{HEAP}", f"-Xms{HEAP}", "-XX:+UseG1GC",
                         f"-Dlog4j2.configurationFile={log4j}",
                         f"-Dkafka.logs.dir={node.directory / 'logs'}", "-cp", classpath(),
                         "kafka.Kafka", str(node.directory / "server.properties")])  # fmt: skip
    return nodes, commands
