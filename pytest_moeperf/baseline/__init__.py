"""Baselines: per-run metric values recorded once per (test, setup) and kept in git."""

from pytest_moeperf.baseline.calibration import Calibration
from pytest_moeperf.baseline.key import HARDWARE_FIELDS, SOFTWARE_FIELDS, BaselineKey, safe_name
from pytest_moeperf.baseline.storage import (
    SCHEMA_VERSION,
    Baseline,
    BaselineStore,
    Provenance,
    read_baseline_file,
)

__all__ = [
    "HARDWARE_FIELDS",
    "SCHEMA_VERSION",
    "SOFTWARE_FIELDS",
    "Baseline",
    "BaselineKey",
    "BaselineStore",
    "Calibration",
    "Provenance",
    "read_baseline_file",
    "safe_name",
]
