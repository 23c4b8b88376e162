"""Running untrusted code: a pool of sandbox servers (`pool`), each a `server.py` process that
forks one child per execution under resource limits, in its own namespaces where it can."""

from rlstream.sandbox.pool import Execution, Sandbox, SandboxUnavailable, configure, shared

__all__ = ["Execution", "Sandbox", "SandboxUnavailable", "configure", "shared"]
