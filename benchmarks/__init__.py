"""Salus benchmarks: the trace generator and the benchmark driver."""
