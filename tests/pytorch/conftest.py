import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for p in (REPO / "tests" / "integration", REPO / "tests" / "pytorch", REPO / "adaptors" / "python",
          REPO / "adaptors" / "pytorch"):
    sys.path.insert(0, str(p))
