"""Apache Kafka's configuration as the project writes it, and the clients' settings per broker
(pure: nothing is started here; tests/integration/test_kafka.py runs the brokers)."""

from __future__ import annotations

from pathlib import Path

from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.kafka import RETENTION, new_topic, producer_settings
from rlstream.ops.stack.kafka import Node, cluster_id, replication, server_properties
from rlstream.schemas import get


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines())


def test_three_nodes_replicate_everything_three_times_with_two_in_sync():
    nodes = [Node(i, 9000 + i, 9100 + i, Path(f"/s/node-{i}")) for i in (1, 2, 3)]
    props = _props(server_properties(nodes[1], nodes))
    assert props["node.id"] == "2" and props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == ",".join(
        f"{i}@127.0.0.1:{9100 + i}" for i in (1, 2, 3)
    )
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9002,CONTROLLER://127.0.0.1:9102"
    for key in ("default.replication.factor", "offsets.topic.replication.factor",
                "transaction.state.log.replication.factor"):  # fmt: skip
        assert props[key] == "3", key
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "2"
    assert props["auto.create.topics.enable"] == "false"
    assert replication(1) == (1, 1) and replication(3) == (3, 2)


def test_a_cluster_id_is_22_url_safe_characters_and_new_each_time():
    a, b = cluster_id(), cluster_id()
    assert (
        len(a) == 22
        and a != b
        and set(a) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    )
    # never an option to the format tool: one id in 64 would start with '-'
    assert not any(cluster_id().startswith("-") for _ in range(2000))


def test_the_format_command_passes_the_cluster_id_as_one_argument(tmp_path, monkeypatch):
    from rlstream.ops.stack import kafka

    monkeypatch.setattr(kafka, "classpath", lambda: "libs/*")
    node = Node(1, 9092, 9093, tmp_path / "node-1")
    cmd = kafka.format_storage(node, "-Qo6IxumSQ-V3LRSy1Od7A")
    assert "--cluster-id=-Qo6IxumSQ-V3LRSy1Od7A" in cmd and "-t" not in cmd


def test_producers_batch_and_are_idempotent_only_on_apache_kafka():
    kafka = producer_settings(Endpoints(broker="kafka"))
    assert kafka["enable_idempotence"] and kafka["acks"] == "all" and kafka["max_batch_size"] > 1
    for broker in ("tansu", "unknown"):
        other = producer_settings(Endpoints(broker=broker))
        assert other["max_batch_size"] == 1 and not other["enable_idempotence"]


def test_topics_carry_the_replication_and_retention_on_the_high_volume_ones():
    rollouts = new_topic(get("rollouts"), Endpoints(replication_factor=3))
    assert rollouts.replication_factor == 3 and rollouts.num_partitions == 4
    assert rollouts.topic_configs["min.insync.replicas"] == "2"
    assert int(rollouts.topic_configs["retention.bytes"]) > 0
    prompts = new_topic(get("prompts"), Endpoints())
    assert "retention.ms" not in prompts.topic_configs and "prompts" not in RETENTION
