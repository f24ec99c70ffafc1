"""Workload specs: YAML files describing model, engine flags, traffic, SLO and search."""

from pytest_moeperf.spec.loader import load_spec, load_spec_text
from pytest_moeperf.spec.model import (
    ArrivalSpec,
    ModelSpec,
    ParallelismSpec,
    SearchSpec,
    Slo,
    Spec,
    WindowSpec,
    WorkloadSpec,
)

__all__ = [
    "ArrivalSpec",
    "ModelSpec",
    "ParallelismSpec",
    "SearchSpec",
    "Slo",
    "Spec",
    "WindowSpec",
    "WorkloadSpec",
    "load_spec",
    "load_spec_text",
]
