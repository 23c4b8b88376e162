"""Benchmarks of whole operations: the broker path and a clean stop."""
