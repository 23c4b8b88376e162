"""rlstream: event-streaming RL post-training of language models with predictive prompt selection."""

__version__ = "0.1.0"
