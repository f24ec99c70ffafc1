"""Per-M kernel A/B of fused-MoE config files: ``pytest_moeperf.ab.perm_cli`` (see its usage).

Kept at this path for the nightly script and the docs' commands; run from the checkout root.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pytest_moeperf.ab.perm_cli import main

if __name__ == "__main__":
    sys.exit(main())
