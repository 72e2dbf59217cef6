"""The bad-input corpus uses the slime-shaped helpers of ``tests/slime`` (args, rollout_data as slime builds them)
and the synthetic dumps of ``tests/analyze``: put both on the import path, whichever tests pytest collected first."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
for path in (TESTS / "slime", TESTS / "lab", TESTS / "launch", TESTS / "bad_input", TESTS):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
