"""Every Prometheus metric rlstream exposes, declared once (STYLE.md rule 7).

Names are `rlstream_<component>_<what>_<unit>`; labels are low-cardinality (a topic, an event,
an error kind — never a prompt id). Processes serve them with `serve(port)`.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, Counter, start_http_server

EVENTS_PUBLISHED = Counter(
    "rlstream_producer_rows_total", "Event rows published, by topic.", ["topic"]
)
MESSAGES_PUBLISHED = Counter(
    "rlstream_producer_messages_total", "Kafka messages published, by topic.", ["topic"]
)
BYTES_PUBLISHED = Counter(
    "rlstream_producer_value_bytes_total", "Encoded message bytes published, by topic.", ["topic"]
)
DEAD_LETTERS = Counter(
    "rlstream_consumer_dead_letters_total",
    "Messages a consumer rejected to the dead-letter topic, by source topic and error kind.",
    ["topic", "kind"],
)


def serve(port: int, addr: str = "127.0.0.1") -> None:
    """Expose the default registry on http://addr:port/metrics."""
    start_http_server(port, addr=addr, registry=REGISTRY)
