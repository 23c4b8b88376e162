"""rlstream: event-streaming RL post-training of language models with prompt selection."""

__version__ = "0.1.0"
