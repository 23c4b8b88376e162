"""The embedded default stack: Tansu, SeaweedFS and Qdrant on loopback, and their supervisor."""
