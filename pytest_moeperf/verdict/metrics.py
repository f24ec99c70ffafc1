"""Metric names, units and which direction is better, in one registry.

The verdict, the baseline files and the report all refer to metrics by name; keeping the unit,
the direction and the smallest change worth reporting here means a new metric is one line.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pytest_moeperf.errors import UsageError

Direction = Literal["higher", "lower"]
# gate: a regression fails the test; informational: shown, never fails; accuracy: judged by the
# accuracy gate (per-question paired test), so the generic run-to-run verdict skips it.
Role = Literal["gate", "informational", "accuracy"]


@dataclass(frozen=True)
class MetricSpec:
    """How to judge one metric: ``min_effect`` is relative (0.01 = 1 %)."""

    name: str
    unit: str
    direction: Direction
    min_effect: float
    role: Role = "gate"
    description: str = ""
    #: the result of an SLO search: each run's value is known only to within the search's
    #: bracket, however alike the runs come out (``stats.judge``'s ``resolution``)
    searched: bool = False

    def __post_init__(self) -> None:
        if self.direction not in ("higher", "lower"):
            raise UsageError(
                f"MetricSpec {self.name!r}",
                "direction",
                self.direction,
                "must be 'higher' or 'lower'",
                "say which direction is better for this metric",
            )
        if not 0.0 <= self.min_effect < 1.0:
            raise UsageError(
                f"MetricSpec {self.name!r}",
                "min_effect",
                self.min_effect,
                "must be a relative change in [0, 1), e.g. 0.01 for 1 %",
                "give the smallest relative change worth failing a build for",
            )

    def is_worse(self, delta_rel: float) -> bool:
        """True when a relative change of ``delta_rel`` (candidate vs baseline) is bad."""
        return delta_rel < 0 if self.direction == "higher" else delta_rel > 0


def _registry(*specs: MetricSpec) -> dict[str, MetricSpec]:
    return {s.name: s for s in specs}


DEFAULT_METRICS: Mapping[str, MetricSpec] = _registry(
    MetricSpec(
        "slo_goodput_tok_s",
        "tok/s",
        "higher",
        0.01,
        description="output tokens/s of requests that met the latency SLO, at the SLO rate",
        searched=True,
    ),
    MetricSpec(
        "slo_rate_rps",
        "req/s",
        "higher",
        0.01,
        description="highest request rate at which the SLO still holds",
        searched=True,
    ),
    MetricSpec("output_tok_s", "tok/s", "higher", 0.01, description="output token throughput"),
    MetricSpec("tok_per_j", "tok/J", "higher", 0.01, description="output tokens per joule"),
    # Tail latencies move more from run to run; 2 % keeps the verdict on changes that matter.
    MetricSpec("ttft_p99_ms", "ms", "lower", 0.02, description="p99 time to first token"),
    MetricSpec("tpot_p99_ms", "ms", "lower", 0.02, description="p99 time per output token"),
    MetricSpec("e2el_p99_ms", "ms", "lower", 0.02, description="p99 end-to-end latency"),
    MetricSpec("mbu", "", "higher", 0.01, description="memory bandwidth utilisation (0..1)"),
    MetricSpec(
        "power_w",
        "W",
        "lower",
        0.02,
        role="informational",
        description="mean board power during the run",
    ),
    MetricSpec(
        "accuracy",
        "",
        "higher",
        0.0,
        role="accuracy",
        description="fraction of questions answered correctly (judged by the accuracy gate)",
    ),
)


def get_metric(
    name: str, *, source: str = "metric name", registry: Mapping[str, MetricSpec] | None = None
) -> MetricSpec:
    """Look a metric up by name; an unknown name is a UsageError that suggests the closest one."""
    reg = DEFAULT_METRICS if registry is None else registry
    spec = reg.get(name)
    if spec is not None:
        return spec
    close = difflib.get_close_matches(name, list(reg), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise UsageError(
        source,
        "metric",
        name,
        "is not a known metric",
        f"{hint}use one of: {', '.join(reg)}",
    )


def generic_metrics(registry: Mapping[str, MetricSpec] | None = None) -> list[MetricSpec]:
    """The metrics the run-to-run verdict judges (everything but the accuracy gate's)."""
    reg = DEFAULT_METRICS if registry is None else registry
    return [s for s in reg.values() if s.role != "accuracy"]
