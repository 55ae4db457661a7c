import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
for p in (REPO / "tests" / "integration", REPO / "tests" / "pytorch", REPO / "adaptors" / "python",
          REPO / "adaptors" / "pytorch"):
    sys.path.insert(0, str(p))


@pytest.fixture(scope="module")
def daemon():
    """A daemon the lazy `salus` device connects to ($SALUS_ENDPOINT, set for the module), on
    $SALUS_TEST_DEVICE when set (scripts/gpu-check --step torchops runs cuda:0)."""
    import salus_torch
    from salus_daemon import Daemon

    device = os.environ.get("SALUS_TEST_DEVICE")
    d = Daemon(*(("--device", device) if device else ()), memory="2GiB", policy="fair")
    old = os.environ.get("SALUS_ENDPOINT")
    os.environ["SALUS_ENDPOINT"] = d.endpoint
    yield d
    salus_torch.device.close()
    if old is None:
        os.environ.pop("SALUS_ENDPOINT")
    else:
        os.environ["SALUS_ENDPOINT"] = old
    d.stop()


@pytest.fixture
def fresh_device():
    """Closes the lazy device after a test, so that every test starts with no sessions."""
    import salus_torch

    yield
    salus_torch.device.close()
