"""Python client of the Salus GPU execution service.

    client = salus.connect("tcp://127.0.0.1:5501")
    s = client.create_session(synthetic={"persistent_bytes": 1 << 20,
                                         "ephemeral_bytes": 1 << 20,
                                         "iteration_seconds": 0.01}, iterations=10)
    s.run()
    s.close()
"""

from salus.client import (
    PROTOCOL_VERSION,
    Client,
    IterationStats,
    PendingIteration,
    SalusError,
    Session,
    SessionRewound,
    SharedBuffer,
    connect,
    default_endpoint,
    read_curve_key,
)

# The project's version (CMakeLists.txt; tests/python/test_versions.py holds them equal).
__version__ = "0.1.0"

__all__ = [
    "PROTOCOL_VERSION",
    "__version__",
    "Client",
    "IterationStats",
    "PendingIteration",
    "SalusError",
    "Session",
    "SessionRewound",
    "SharedBuffer",
    "connect",
    "default_endpoint",
    "read_curve_key",
]
