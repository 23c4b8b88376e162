"""The `rlstream` command: one module per command group (run, stack, topics, bench, serve,
reliability, datasets, train and selection). Errors a user can fix are caught in `main` and
printed as one line."""

from __future__ import annotations

import sys

from rlstream.cli import (
    bench,
    datasets,
    env,
    reliability,
    run,
    selection,
    serve,
    stack,
    topics,
    train,
)
from rlstream.cli.app import app, bench_app, endpoints, err

train.register(app, bench_app)
selection.register(bench_app)

__all__ = [
    "app",
    "main",
    "bench",
    "datasets",
    "env",
    "reliability",
    "run",
    "serve",
    "stack",
    "topics",
]


def _user_errors() -> tuple[type[BaseException], ...]:
    try:  # the learning-core commands run where the streaming stack is not installed
        from aiokafka.errors import KafkaConnectionError, KafkaError
    except ImportError:
        return (ValueError, FileNotFoundError)
    from rlstream.connectors.files import UnsupportedFile
    from rlstream.connectors.kafka import TopicConfigError
    from rlstream.connectors.reading import TopicNotFound
    from rlstream.ops.commands.replay import BadTime
    from rlstream.ops.launcher.childrun import RunFailed
    from rlstream.ops.stack.embedded import StackError

    return (KafkaConnectionError, KafkaError, UnsupportedFile, TopicConfigError, TopicNotFound,
            BadTime, StackError, RunFailed, ValueError, FileNotFoundError,
            TimeoutError)  # fmt: skip


def main() -> None:
    """Run the CLI; errors a user can fix become one line on stderr and exit status 2."""
    from rlstream.ops.stack.procs import heed_interrupts

    heed_interrupts()
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001  (narrowed just below)
        if not isinstance(exc, _user_errors()):
            raise
        err.print(f"[red]error:[/] {_explain(exc)}")
        sys.exit(2)


def _explain(exc: BaseException) -> str:
    if type(exc).__name__ == "KafkaConnectionError":  # aiokafka may not be installed here
        where = endpoints()
        tls = (
            f", and RLSTREAM_KAFKA_SSL_CAFILE (now {where.kafka_ssl_cafile or 'the system CAs'})"
            if where.kafka_security_protocol in ("SSL", "SASL_SSL")
            else ""
        )
        if where.kafka_sasl_mechanism:  # aiokafka says the same for a refused password
            return (
                f"cannot reach or sign in to the Kafka broker at {where.kafka_bootstrap} "
                f"({where.kafka_sasl_mechanism} as {where.kafka_username!r}): check "
                "RLSTREAM_KAFKA_BOOTSTRAP, RLSTREAM_KAFKA_USERNAME and RLSTREAM_KAFKA_PASSWORD"
                + tls
            )
        if tls:  # a certificate the client cannot verify reads the same
            return (
                f"cannot reach or verify the Kafka broker at {where.kafka_bootstrap} over TLS: "
                f"check RLSTREAM_KAFKA_BOOTSTRAP{tls}"
            )
        return (
            f"cannot reach the Kafka broker at {where.kafka_bootstrap}: start the embedded "
            "stack with `rlstream stack up`, or set RLSTREAM_KAFKA_BOOTSTRAP"
        )
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
