"""Security benchmarks: what one tenant can do to another's service (flood.py)."""
