"""Operations: what runs the system, one folder per concern: the embedded stack (`stack/`),
the run launcher and its live view (`launcher/`), user commands over the topics (`commands/`),
the HTTP API and web view (`api/`), the reliability suites (`reliability/`), benchmarks
(`bench/`)."""
