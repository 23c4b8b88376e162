"""Stream processors (faust-streaming agents), one agent per stream."""
