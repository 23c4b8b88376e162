"""Where the infrastructure is: one frozen `Endpoints`, read from the environment.

Precedence: RLSTREAM_* environment variables, then the endpoints file that `rlstream stack up`
writes under the state directory, then loopback defaults. Secrets are kept out of `repr`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

ENDPOINTS_FILE = "endpoints.json"

_ENV = {
    "kafka_bootstrap": "RLSTREAM_KAFKA_BOOTSTRAP",
    "broker": "RLSTREAM_BROKER",
    "replication_factor": "RLSTREAM_KAFKA_REPLICATION",
    "retention_mb": "RLSTREAM_KAFKA_RETENTION_MB",
    "kafka_security_protocol": "RLSTREAM_KAFKA_SECURITY_PROTOCOL",
    "kafka_sasl_mechanism": "RLSTREAM_KAFKA_SASL_MECHANISM",
    "kafka_username": "RLSTREAM_KAFKA_USERNAME",
    "kafka_password": "RLSTREAM_KAFKA_PASSWORD",
    "kafka_ssl_cafile": "RLSTREAM_KAFKA_SSL_CAFILE",
    "s3_endpoint": "RLSTREAM_S3_ENDPOINT",
    "s3_access_key": "RLSTREAM_S3_ACCESS_KEY",
    "s3_secret_key": "RLSTREAM_S3_SECRET_KEY",
    "s3_bucket": "RLSTREAM_S3_BUCKET",
    "s3_secure": "RLSTREAM_S3_SECURE",
    "qdrant_url": "RLSTREAM_QDRANT_URL",
    "qdrant_path": "RLSTREAM_QDRANT_PATH",
    "session_timeout_ms": "RLSTREAM_SESSION_TIMEOUT_MS",
    "prometheus_url": "RLSTREAM_PROMETHEUS_URL",
    "prometheus_targets": "RLSTREAM_PROMETHEUS_TARGETS",
}


ENDPOINT_VARIABLES = frozenset(_ENV.values())
"""What a child process must not inherit to find no configured stack."""


def state_dir() -> Path:
    """The embedded stack's state directory: $RLSTREAM_HOME, else ./.rlstream."""
    return Path(os.environ.get("RLSTREAM_HOME", ".rlstream")).resolve()


@dataclass(frozen=True)
class Endpoints:
    """Addresses and credentials of the broker, the object store and the vector store."""

    kafka_bootstrap: str = "127.0.0.1:9092"
    broker: str = "unknown"
    """What the broker is: `kafka` (Apache Kafka: batched, idempotent producers), `tansu` or
    `unknown` (one record per batch, no idempotence: what any Kafka-protocol broker takes)."""
    replication_factor: int = 1
    """Replicas of each topic rlstream creates (3 on a three-node Kafka, min ISR one less)."""
    retention_mb: int = 512
    """Size retention of each partition of the high-volume topics rlstream creates, MiB (Apache
    Kafka enforces it, segment by segment; Tansu's memory storage ignores it)."""
    kafka_security_protocol: str = "PLAINTEXT"
    """PLAINTEXT; SASL_PLAINTEXT / SASL_SSL for a broker that authenticates clients; SSL for
    one that speaks TLS without authenticating them."""
    kafka_sasl_mechanism: str | None = None
    """SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN (with kafka_username / kafka_password)."""
    kafka_username: str | None = field(default=None, repr=False)
    kafka_password: str | None = field(default=None, repr=False)
    kafka_ssl_cafile: str | None = None
    """The CA certificates (PEM) that verify a TLS broker (SSL, SASL_SSL); unset: the system's.
    The embedded stack's is `<stack>/kafka/tls/ca.pem`."""
    s3_endpoint: str = "127.0.0.1:8333"
    s3_access_key: str = field(default="rlstream", repr=False)
    s3_secret_key: str = field(default="rlstream-secret", repr=False)
    s3_bucket: str = "rlstream"
    s3_secure: bool = False
    qdrant_url: str | None = None
    """A Qdrant server URL; when unset, Qdrant runs embedded (qdrant-edge) under `qdrant_path`."""
    qdrant_path: str | None = None
    session_timeout_ms: int = 10_000
    """Consumer-group session timeout; the first join on Tansu waits about half of it."""
    prometheus_url: str | None = None
    """A Prometheus server scraping the runs (`rlstream stack up --prometheus`)."""
    prometheus_targets: str | None = None
    """Its file_sd directory: each run writes `<run_id>.json` there while it runs."""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Endpoints:
        env = dict(os.environ if env is None else env)
        base = cls.from_state_file(state_dir()) or cls()
        overrides: dict[str, object] = {}
        for name, var in _ENV.items():
            if var in env and env[var] != "":
                overrides[name] = _parse(name, var, env[var])
        return replace(base, **overrides)

    @classmethod
    def from_state_file(cls, directory: Path) -> Endpoints | None:
        path = directory / ENDPOINTS_FILE
        if not path.exists():
            return None
        if path.stat().st_mode & 0o077:  # it holds the stack's keys
            raise PermissionError(f"{path} is readable by others; `chmod 600 {path}`")
        data = json.loads(path.read_text())
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / ENDPOINTS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.chmod(0o600)
        tmp.replace(path)
        return path

    def as_env(self) -> dict[str, str]:
        """The environment variables that reproduce these endpoints in a child process."""
        out = {}
        for name, var in _ENV.items():
            value = getattr(self, name)
            if value is not None:
                out[var] = str(value).lower() if isinstance(value, bool) else str(value)
        return out

    def public(self) -> dict[str, object]:
        """Everything but the secrets, for logs and status tables."""
        return {k: v for k, v in asdict(self).items() if k not in SECRET_FIELDS}

    @property
    def is_kafka(self) -> bool:
        """Apache Kafka: correct ListOffsets, idempotent producers, transactions, retention."""
        return self.broker == "kafka"

    def kafka_auth(self) -> dict[str, object]:
        """aiokafka's security settings (none for a PLAINTEXT broker)."""
        if self.kafka_security_protocol == "PLAINTEXT":
            return {}
        auth: dict[str, object] = {"security_protocol": self.kafka_security_protocol}
        if self.kafka_sasl_mechanism:
            auth |= {"sasl_mechanism": self.kafka_sasl_mechanism,
                     "sasl_plain_username": self.kafka_username,
                     "sasl_plain_password": self.kafka_password}  # fmt: skip
        if self.kafka_security_protocol in ("SSL", "SASL_SSL"):
            from aiokafka.helpers import create_ssl_context

            auth["ssl_context"] = create_ssl_context(cafile=self.kafka_ssl_cafile)
        return auth


SECRET_FIELDS = ("s3_access_key", "s3_secret_key", "kafka_username", "kafka_password")
PROTOCOLS = ("PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL")
BROKER_KINDS = ("kafka", "tansu", "unknown")
MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")


def _parse(name: str, var: str, raw: str) -> object:
    if name == "s3_secure":
        if raw.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"{var}={raw!r}: expected true or false")
        return raw.lower() in ("true", "1")
    if name == "kafka_security_protocol" and raw not in PROTOCOLS:
        raise ValueError(f"{var}={raw!r}: expected one of {', '.join(PROTOCOLS)}")
    if name == "kafka_sasl_mechanism" and raw not in MECHANISMS:
        raise ValueError(f"{var}={raw!r}: expected one of {', '.join(MECHANISMS)}")
    if name == "session_timeout_ms":
        if not raw.isdigit():
            raise ValueError(f"{var}={raw!r}: expected a whole number of milliseconds")
        return int(raw)
    if name == "broker" and raw not in BROKER_KINDS:
        raise ValueError(f"{var}={raw!r}: expected one of {', '.join(BROKER_KINDS)}")
    if name == "replication_factor":
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"{var}={raw!r}: expected a whole number of replicas, 1 or more")
        return int(raw)
    if name == "retention_mb":
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"{var}={raw!r}: expected a whole number of MiB, 1 or more")
        return int(raw)
    return raw


def setting_from_env(name: str, default: object) -> object:
    """One endpoint setting from its RLSTREAM_* variable (parsed and checked), else `default`:
    for a stack that makes its own endpoints but honours a setting (the embedded stack's
    retention)."""
    var = _ENV[name]
    raw = os.environ.get(var, "")
    return _parse(name, var, raw) if raw else default
