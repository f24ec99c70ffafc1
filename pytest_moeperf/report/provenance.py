"""The provenance sections of the report: "Setup", "Not covered" and "Reproduce".

Why derived from the data and not written by hand: what a reader must not extrapolate (board
power only, CPU backend ignoring MoE configs, quick mode) depends on how each run was measured,
and a static disclaimer would be wrong for half the runs.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_moeperf.hygiene.model import NOISY_PREFIX
from pytest_moeperf.report.cards import band_width
from pytest_moeperf.report.content import Table, missing_text, slo_text
from pytest_moeperf.report.model import Result, Run, bar_labels

WIDE_BAND = 0.02  # a goodput band wider than this is worth a line in "Not covered"
FREE_TEXT_OPTIONS = ("-k", "-m", "--moeperf-reason")  # their values hold spaces


def _parallelism(s: Mapping[str, Any]) -> str | None:
    if not any(k in s for k in ("tp", "dp", "ep")):
        return None
    return f"tp={s.get('tp', '?')}, dp={s.get('dp', '?')}, ep={'on' if s.get('ep') else 'off'}"


def _accel(s: Mapping[str, Any]) -> str | None:
    name = s.get("accelerator")
    if name is None:
        return None
    n = s.get("gpu_count")
    return f"{n} × {name}" if isinstance(n, int) and s.get("backend") != "cpu" else str(name)


def _gpu(s: Mapping[str, Any]) -> str | None:
    """Power limit, max clocks and memory of the first GPU (the ones a result used match)."""
    gpus = s.get("gpus")
    g = gpus[0] if isinstance(gpus, list) and gpus and isinstance(gpus[0], Mapping) else None
    if g is None:
        return None
    parts = []
    if isinstance(w := g.get("power_limit_w"), (int, float)):
        parts.append(f"{w:g} W power limit")
    if isinstance(sm := g.get("sm_clock_max_mhz"), int):
        parts.append(f"SM {sm:,} MHz")
    if isinstance(mem := g.get("mem_clock_max_mhz"), int):
        parts.append(f"memory {mem:,} MHz")
    if isinstance(b := g.get("memory_total_bytes"), int):
        parts.append(f"{b / 2**30:.1f} GiB")
    return ", ".join(parts) or None


def _gate(r: Result) -> str:
    a = r.accuracy
    if not a:
        return "none"
    return f"{a.get('task', '?')}, {a.get('shots', '?')}-shot, n={a.get('n', '?')}"


def setup_table(results: Sequence[Result]) -> Table:
    """Rows are setup fields, columns configs; identical columns merge into one "all" column."""
    fields: list[tuple[str, Any]] = [
        ("accelerator", lambda r: _accel(r.setup)),
        ("rated bandwidth", lambda r: _opt(r.setup.get("rated_bandwidth_tb_s"), "TB/s")),
        (
            "driver / CUDA",
            lambda r: f"{r.setup.get('driver') or 'n/a'} / {r.setup.get('cuda') or 'n/a'}",
        ),
        (
            "engine (backend)",
            lambda r: f"{r.setup.get('engine') or 'n/a'} ({r.setup.get('backend') or 'n/a'})",
        ),
        ("model", lambda r: r.setup.get("model")),
        (
            "dtype / quantization",
            lambda r: f"{r.setup.get('dtype') or 'n/a'} / {r.setup.get('quantization') or 'none'}",
        ),
        ("GPU limits", lambda r: _gpu(r.setup)),
        ("host CPU", lambda r: r.setup.get("cpu")),
        ("host calibration", lambda r: _calibration(r.setup)),
        ("parallelism", lambda r: _parallelism(r.setup)),
        ("MoE config", lambda r: _moe(r.moe_config)),
        ("spec", lambda r: r.spec.get("name")),
        ("trace", lambda r: r.spec.get("trace")),
        ("arrival", lambda r: r.spec.get("arrival")),
        ("SLO", lambda r: slo_text(r.spec)),
        ("power source", lambda r: r.setup.get("power_source")),
        ("runs per config, band", lambda r: _runs(r)),
        ("accuracy gate", _gate),
        (
            "host / commit",
            lambda r: f"{r.setup.get('host') or 'n/a'} / {r.setup.get('commit') or 'n/a'}",
        ),
        ("machine hygiene", _hygiene_summary),
    ]
    cols = [[str(v) if (v := get(r)) is not None else "n/a" for _, get in fields] for r in results]
    if all(c == cols[0] for c in cols):
        return Table(("", "all configs"), tuple((f[0], cols[0][i]) for i, f in enumerate(fields)))
    labels = tuple(bar_labels(results))
    rows = tuple((f[0], *(c[i] for c in cols)) for i, f in enumerate(fields))
    return Table(("", *labels), rows)


def _calibration(setup: Mapping[str, Any]) -> str:
    """The session's host figures, as the "another machine" warnings print them; results from
    before 2026-12-07, and external servers measured from elsewhere, have none."""
    from pytest_moeperf.baseline.calibration import Calibration
    from pytest_moeperf.errors import UsageError

    raw = setup.get("calibration")
    if raw is None:
        return "not recorded"
    try:
        return Calibration.from_dict(raw, source="the result's setup.calibration").summary()
    except UsageError:
        return "unreadable"


def _hygiene_summary(r: Result) -> str:
    h = r.hygiene
    if h is None:
        return "not recorded (results from before hygiene checks)"
    n = h.counts()
    if h.noisy:
        return f"noisy: {len(h.noisy)} warning(s) that spoil the numbers (see below)"
    return f"quiet: {n['ok']} ok, {n['warn']} warn, {n['unknown']} unknown"


HYGIENE_HEADERS = ("config", "check", "status", "found before load")


def hygiene_table(results: Sequence[Result]) -> Table:
    """Every hygiene check per config; configs whose checks read the same merge into one."""
    per: list[list[tuple[str, str, str]]] = []
    for r in results:
        h = r.hygiene
        if h is None:
            per.append([("(none)", "n/a", "not recorded: these results predate hygiene checks")])
            continue
        rows = [("scope", "note", note) for note in h.notes]
        rows += [(c.name, c.status + (" (spoils the numbers)" if c.noisy else ""), c.detail)
                 for c in h.checks]  # fmt: skip
        per.append(rows)
    if not per:
        return Table(HYGIENE_HEADERS, ())
    if all(p == per[0] for p in per):
        return Table(HYGIENE_HEADERS, tuple(("all configs", *row) for row in per[0]))
    labels = bar_labels(results)
    return Table(HYGIENE_HEADERS,
                 tuple((label, *row) for label, p in zip(labels, per, strict=True)
                       for row in p))  # fmt: skip


def _opt(v: object, unit: str) -> str | None:
    return None if v is None else f"{v} {unit}"


def _moe(m: Mapping[str, Any]) -> str | None:
    if not m:
        return None
    loaded = m.get("loaded")
    n = len(loaded) if isinstance(loaded, list) else 0
    h = str(m.get("hash") or "")[:12]
    return f"{m.get('name', '?')} (hash {h or 'n/a'}, {n} file(s) loaded)"


def _runs(r: Result) -> str:
    runs = r.spec.get("runs")
    m = r.metric("slo_goodput_tok_s")
    n = len(m.runs) if m is not None else 0
    band = "; shaded = baseline band" if r.verdict("slo_goodput_tok_s") else ""
    return f"{runs if runs is not None else n} runs ({n} recorded); error bars = min-max{band}"


def not_covered(runs: Sequence[Run]) -> list[str]:
    """What not to extrapolate from these numbers, derived from the data, most important first."""
    results = [r for run in runs for r in run.results]
    labels = dict(zip(map(id, results), bar_labels(results), strict=True))
    out: list[str] = []

    def add(text: str) -> None:
        if text not in out:
            out.append(text)

    no_accuracy = [labels[id(r)] for r in results
                   if not r.accuracy and r.setup.get("backend") not in (None, "cpu")]  # fmt: skip
    for r in results:
        label, src = labels[id(r)], r.setup.get("power_source")
        if r.hygiene is not None and r.hygiene.noisy:
            add(f"{label} was measured on a noisy machine: " + "; ".join(r.hygiene.noisy) + ".")
        if src and src != "not_measured":
            add(
                f"Power and tok/J are GPU board power from NVML ({src}) only, not the whole "
                "node (CPUs, DRAM, NICs, fans and cooling are not included)."
            )
        else:
            m = r.metric("tok_per_j")
            why = missing_text(m.note if m is not None else None)
            where = r.setup.get("accelerator") or "this host"
            add(f"Energy was {why} on {where}: no energy or power conclusion can be drawn.")
        if r.setup.get("backend") == "cpu":
            check = r.moe_config.get("check")
            add(
                "The CPU backend ignores fused-MoE kernel configs: differences between configs "
                "here are run-to-run noise, not the config"
                + (f" (check: {check})" if check else "")
                + "."
            )
            add("CPU numbers do not extrapolate to GPU throughput, latency or MBU.")
        if label in no_accuracy:
            add(
                f"No accuracy measured for {', '.join(no_accuracy)} (e.g. dummy weights): a "
                "config that produces wrong tokens faster would not be caught."
            )
        if r.setup.get("backend") not in (None, "cpu") and r.moe_config.get("loaded") == []:
            add(
                f"{label} loaded no fused-MoE config file (vLLM's default tiling): its "
                "figures are of the untuned kernel, not of a tuned config."
            )
        status = r.baseline.get("status")
        if status == "written":
            add(
                f"{label} was not compared with a baseline: this run wrote it "
                "(--moeperf-refresh-baselines), so it has no verdict."
            )
        elif status and status != "compared":
            add(f"{label} was not compared with a baseline: {status}.")
        if r.outcome == "partial":
            add(f"{label} is partial: " + ("; ".join(r.reasons) or "interrupted") + ".")
        n = r.spec.get("runs")
        if isinstance(n, int) and n < 3:
            add(f"Only {n} run(s) per config: the variance band is a rough estimate.")
    if any(run.quick for run in runs):
        add(
            "Quick mode: fewer requests and probes, one run per config; numbers are indicative "
            "and were not written as baselines."
        )
    traces = sorted(
        {f"{r.spec.get('trace', 'n/a')} ({r.spec.get('arrival', 'n/a')})" for r in results}
    )
    if traces:
        add(
            f"Only the trace(s) {'; '.join(traces)}: other prompt/output lengths or "
            "burstiness can rank configs differently."
        )
    for p in sorted({p for r in results if (p := _parallelism(r.setup))}):
        add(f"Only {p}: other parallelism layouts are not covered.")
    bands = [
        f"{_pct(width)} for {labels[id(r)]}"
        for r in results
        if (width := band_width(r.metric("slo_goodput_tok_s"))) is not None and width >= WIDE_BAND
    ]
    if bands:
        add(
            "The run-to-run band of SLO goodput (max - min of the runs over the median) is "
            + ", ".join(bands)
            + ": a difference smaller than that is not shown by these runs."
        )
    warned: dict[str, list[str]] = {}
    for run in runs:
        for w in run.warnings:
            if NOISY_PREFIX not in w:  # said above, per config, from the result's hygiene
                warned.setdefault(w, []).append(run.source)
    for w, sources in warned.items():
        add(f"Warning in {', '.join(dict.fromkeys(sources))}: {w}")
    return out


def _pct(x: float) -> str:
    return f"{x * 100:.1f} %"


def reproduce(runs: Sequence[Run], sources: Sequence[str], title: str, out: str) -> list[str]:
    """The recorded commands, then the command that rebuilds this report."""
    cmds: list[str] = []
    for run in runs:
        recorded = [run.command, *(r.setup.get("command") for r in run.results)]
        for c in recorded:
            if isinstance(c, str) and c and requote(c) not in cmds:
                cmds.append(requote(c))
    cmds.append(shlex.join(["moeperf", "report", *sources, "--title", title, "--out", out]))
    return cmds


def requote(command: str) -> str:
    """A recorded pytest command with its quoting restored, so it can be pasted into a shell.

    The plugin records ``sys.argv`` joined by spaces, which loses the quotes around a ``-k``
    expression or a ``--moeperf-reason`` text: their words are taken up to the next option and
    quoted again, every other word is quoted where the shell needs it. A command that already
    holds quotes, or is not a pytest command, is returned as recorded.
    """
    words = command.split(" ")
    if "'" in command or '"' in command or not words or words[0] != "pytest":
        return command
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        opt, eq, first = word.partition("=")
        if opt in FREE_TEXT_OPTIONS and (eq or i + 1 < len(words)):
            value = [first if eq else words[i + 1]]
            i += 1 if eq else 2
            while i < len(words) and not words[i].startswith("-"):
                value.append(words[i])
                i += 1
            text = " ".join(value)
            out.append(f"{opt}={shlex.quote(text)}" if eq else f"{opt} {shlex.quote(text)}")
            continue
        out.append(shlex.quote(word) if word else "''")
        i += 1
    return " ".join(out)


def generated_note(runs: Sequence[Run]) -> str:
    parts = []
    for run in runs:
        when = "n/a"
        if run.finished is not None:
            when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(run.finished))
        parts.append(
            f"{run.source}: {len(run.results)} result(s), finished {when}, "
            f"plugin {run.plugin_version or 'n/a'}"
        )
    return "; ".join(parts)
