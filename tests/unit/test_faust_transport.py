"""faust apps built by make_app use the short-fetch transport and keep data out of the cwd."""

from __future__ import annotations

import asyncio

from rlstream.connectors.endpoints import Endpoints
from rlstream.streams import transport
from rlstream.streams.app import make_app


def test_faust_worker_consumers_park_fetches_briefly(tmp_path, monkeypatch):
    monkeypatch.setenv("RLSTREAM_FAUST_DIR", str(tmp_path / "run" / "faust"))
    app = make_app("unit-transport", Endpoints(kafka_bootstrap="127.0.0.1:9"))
    assert isinstance(app.transport, transport.Transport)
    assert app.conf.datadir == tmp_path / "run" / "faust" / "unit-transport-data"
    app.conf.datadir.mkdir()  # what faust does on start: only the last level

    async def build():  # aiokafka clients are built inside a running loop; nothing connects
        async def noop(*args):
            return None

        consumer = app.transport.create_consumer(
            callback=noop, on_partitions_revoked=noop, on_partitions_assigned=noop
        )
        thread = consumer._new_consumer_thread()
        assert isinstance(thread, transport.ConsumerThread)
        client = thread._create_worker_consumer(app.transport)
        return client._fetch_max_wait_ms

    # faust's own driver would say 1500 (Tansu then parks each fetch ~380 ms at the median)
    assert asyncio.run(build()) == transport.FETCH_MAX_WAIT_MS == 50
