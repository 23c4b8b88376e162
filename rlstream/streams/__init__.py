"""Stream processors (faust-streaming agents), one agent per stream."""

EXIT_STOPPED = 3
"""A process's exit status when it stopped the run on purpose (the trainer, on a broken
environment): the supervisor does not restart it, and reports its log's last STOPPED_PREFIX
line."""
STOPPED_PREFIX = "run stopped: "
