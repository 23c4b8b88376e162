"""Operations: the embedded stack, metrics, reports and benchmarks."""
