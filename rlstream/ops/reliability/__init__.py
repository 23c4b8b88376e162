"""The reliability suites: chaos (scheduled faults) and fuzz (malformed messages), with audits."""
