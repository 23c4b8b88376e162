"""User commands over the topics: publish, tail and replay, reprocess, topics."""
