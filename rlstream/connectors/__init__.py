"""Connectors to the infrastructure: endpoints, Kafka, the object store and the vector store."""

from rlstream.connectors.endpoints import Endpoints, state_dir

__all__ = ["Endpoints", "state_dir"]
