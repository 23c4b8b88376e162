"""Stream processors (faust-streaming agents), one agent per stream. Filled in by the streaming-loop issue."""
