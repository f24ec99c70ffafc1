"""Machine facts that key CPU baselines: the CPU model and the usable cores."""

from __future__ import annotations

from pathlib import Path

from pytest_moeperf.environment import cpu_model, usable_cpus


def test_cpu_model_reads_the_model_name(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n"
                    "model name\t: AMD EPYC 9554   64-Core Processor\nflags\t: fpu\n")  # fmt: skip
    assert cpu_model(info) == "AMD EPYC 9554 64-Core Processor"


def test_cpu_model_without_cpuinfo_falls_back_to_the_platform(tmp_path: Path) -> None:
    assert cpu_model(tmp_path / "missing")  # e.g. "x86_64": never empty


def test_usable_cpus_is_positive() -> None:
    assert usable_cpus() >= 1
