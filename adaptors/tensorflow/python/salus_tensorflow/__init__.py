"""The SALUS device for TensorFlow 2.

Installing this package puts the plugin into ``site-packages/tensorflow-plugins``; TensorFlow
loads it at import and lists ``/physical_device:SALUS:0``. Each traced step placed on SALUS runs
in salus-server as one iteration of a session (``SALUS_ENDPOINT`` names the daemon; by default
its ipc socket). A job needs nothing else: no import of this package, no change to its code.
"""

from __future__ import annotations

import os

__all__ = ["__version__", "plugin_path", "wire_library_path"]

# The project's version (CMakeLists.txt; tests/python/test_versions.py holds them equal).
__version__ = "0.1.0"


def plugin_path() -> str:
    """Where the TensorFlow plugin is installed."""
    site = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(site, "tensorflow-plugins", "libsalus_tensorflow.so")


def wire_library_path() -> str:
    """The client library the plugin loads."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "libsalus_tf_wire.so")
