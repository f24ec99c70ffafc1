"""Host checks from /proc and /sys: other work on the CPUs, other inference servers, the CPU
frequency governor, memory and swap.

Why these: the load generator and (on the CPU backend) the server itself run on the host CPUs,
so a second job, a second server, a 'powersave' governor or a swapping machine moves TTFT and
goodput as much as any kernel config. Every function takes ``root`` so tests can give a fake
/proc and /sys; nothing here writes anywhere.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from pytest_moeperf.hygiene.model import OK, UNKNOWN, WARN, HygieneCheck

GIB = 2.0**30
# argv entries that mark an inference server (exact, or the basename of an executable)
_SERVER_MODULES = (
    "vllm.entrypoints.openai.api_server",
    "vllm.entrypoints.api_server",
    "sglang.launch_server",
)
_SERVER_EXES = ("text-generation-launcher", "trtllm-serve")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    state: str
    cpu_ticks: int  # utime + stime of the whole process
    argv: tuple[str, ...]
    child_ticks: int = 0  # cutime + cstime: of the children it has waited for


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def process_table(root: Path = Path("/")) -> dict[int, Proc]:
    """Every process visible in ``root``/proc; ones that exit while being read are skipped."""
    out: dict[int, Proc] = {}
    for d in (root / "proc").glob("[0-9]*"):
        stat = read_text(d / "stat")
        if stat is None or ")" not in stat:
            continue
        try:
            fields = stat.rsplit(")", 1)[1].split()
            pid = int(d.name)
            ticks = int(fields[11]) + int(fields[12])  # utime, stime (stat fields 14, 15)
            reaped = sum(int(x) for x in fields[13:15])  # cutime, cstime (fields 16, 17)
            proc = Proc(pid, int(fields[1]), int(fields[2]), fields[0], ticks, (), reaped)
        except (IndexError, ValueError):
            continue
        try:
            raw = (d / "cmdline").read_bytes()
        except OSError:  # exited since its stat was read, or not ours to read
            raw = b""
        argv = tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a)
        out[pid] = replace(proc, argv=argv)
    return out


def descendants(table: dict[int, Proc], roots: Iterable[int]) -> set[int]:
    """``roots`` and every process below them in the parent tree."""
    found = set(roots)
    children: dict[int, list[int]] = {}
    for p in table.values():
        children.setdefault(p.ppid, []).append(p.pid)
    todo = list(found)
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


def group_members(table: dict[int, Proc], pgid: int) -> set[int]:
    return {p.pid for p in table.values() if p.pgid == pgid}


def is_server(argv: tuple[str, ...]) -> bool:
    """An inference server's command line (vLLM, SGLang, TGI, TensorRT-LLM)."""
    for i, a in enumerate(argv):
        base = a.rsplit("/", 1)[-1]
        if a in _SERVER_MODULES or base in _SERVER_EXES:
            return True
        if base == "vllm" and i + 1 < len(argv) and argv[i + 1] == "serve":
            return True
    return False


def port_of(argv: tuple[str, ...]) -> int | None:
    """The port a server's command line asks for (vLLM's default 8000 when it names none)."""
    for i, a in enumerate(argv):
        if a == "--port" and i + 1 < len(argv) and argv[i + 1].isdigit():
            return int(argv[i + 1])
        if a.startswith("--port=") and a[7:].isdigit():
            return int(a[7:])
    vllm = any(a.startswith("vllm.") or a.rsplit("/", 1)[-1] == "vllm" for a in argv)
    return 8000 if vllm else None


def local_server_for(table: dict[int, Proc], url: str) -> int | None:
    """The pid of the server on this machine that ``url`` points at (localhost and its port)."""
    u = urlsplit(url if "://" in url else f"http://{url}")
    if u.hostname not in {"localhost", "127.0.0.1", "::1", "0.0.0.0", socket.gethostname()}:
        return None
    try:
        port = u.port or (443 if u.scheme == "https" else 80)
    except ValueError:  # a port that is not a number: no server listens there
        return None
    servers = {p.pid for p in table.values() if p.state != "Z" and is_server(p.argv)}
    found = sorted(
        pid
        for pid in servers
        if table[pid].ppid not in servers and port_of(table[pid].argv) == port
    )
    return found[0] if found else None


def server_label(argv: tuple[str, ...]) -> str:
    """'vllm.entrypoints.openai.api_server --port 8000': what and where, not the whole argv."""
    what = next(
        (
            a.rsplit("/", 1)[-1]
            for a in argv
            if a in _SERVER_MODULES or a.rsplit("/", 1)[-1] in (*_SERVER_EXES, "vllm")
        ),
        "server",
    )
    port = port_of(argv)
    return what + (f" --port {port}" if port else "")


def other_servers_check(table: dict[int, Proc], mine: set[int]) -> HygieneCheck:
    """Inference servers on this machine that this pytest session did not start."""
    servers = {p.pid for p in table.values() if p.state != "Z" and is_server(p.argv)}
    # one entry per server: skip a match whose parent also matched (a wrapper, `flock ... vllm`)
    top = sorted(pid for pid in servers if table[pid].ppid not in servers)
    others = [pid for pid in top if pid not in mine]
    ours = [pid for pid in top if pid in mine]
    value = {
        "others": [{"pid": pid, "cmdline": " ".join(table[pid].argv)[:200]} for pid in others],
        "this_session": ours,
    }
    if others:
        names = "; ".join(f"pid {pid}: {server_label(table[pid].argv)}" for pid in others)
        return HygieneCheck(
            "host.other_servers",
            WARN,
            value,
            f"{len(others)} inference server(s) not started by this session "
            f"are running ({names}): they share CPUs, memory bandwidth and maybe "
            "GPUs",
            spoils=True,
        )
    extra = f"; {len(ours)} server(s) of this session are up" if ours else ""
    return HygieneCheck(
        "host.other_servers", OK, value, "no inference server from outside this session" + extra
    )


def _cpu_busy_ticks(root: Path) -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat; busy excludes idle and iowait."""
    text = read_text(root / "proc" / "stat")
    if not text or not text.startswith("cpu "):
        return None
    nums = [int(x) for x in text.splitlines()[0].split()[1:]]
    total = sum(nums[:8])  # guest time is already inside user/nice
    idle = nums[3] + (nums[4] if len(nums) > 4 else 0)
    return total - idle, total


def _swap_pages(root: Path) -> int | None:
    text = read_text(root / "proc" / "vmstat")
    if text is None:
        return None
    vals = dict(line.split()[:2] for line in text.splitlines() if len(line.split()) >= 2)
    try:
        return int(vals.get("pswpin", 0)) + int(vals.get("pswpout", 0))
    except ValueError:
        return None


@dataclass(frozen=True)
class Sample:
    """What changed over the sample window: CPU used by others, pages swapped."""

    seconds: float
    other_cores: float | None  # CPUs' worth of time used by processes outside this session
    swapped_pages: int | None
    own_cores: float | None = None  # the same for this session's processes


def sample(root: Path, mine: set[int], seconds: float) -> Sample:
    """Measure CPU use by processes outside ``mine``, and swap traffic, over ``seconds``."""
    hz = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0

    def own_ticks() -> dict[int, int]:
        t = process_table(root)
        return {p: t[p].cpu_ticks for p in mine if p in t}

    b0, s0, o0, t0 = _cpu_busy_ticks(root), _swap_pages(root), own_ticks(), time.monotonic()
    time.sleep(seconds)
    b1, s1, o1, t1 = _cpu_busy_ticks(root), _swap_pages(root), own_ticks(), time.monotonic()
    other = None
    own = sum(v - o0.get(p, 0) for p, v in o1.items()) / hz / max(t1 - t0, 1e-9)
    if b0 is not None and b1 is not None and t1 > t0:
        other = max(0.0, (b1[0] - b0[0]) / hz / (t1 - t0) - own)
    swapped = None if s0 is None or s1 is None else s1 - s0
    return Sample(t1 - t0, other, swapped, own)


def cpu_load_check(root: Path, cores: int, smp: Sample | None) -> HygieneCheck:
    """Another job on the CPUs: CPU time used outside this session, else the load average."""
    text = read_text(root / "proc" / "loadavg")
    loads = [float(x) for x in text.split()[:3]] if text else None
    value = {
        "loadavg": loads,
        "cores": cores,
        "other_cores": None if smp is None else smp.other_cores,
        "session_cores": None if smp is None else smp.own_cores,
    }
    limit = max(0.5, 0.1 * cores)
    if smp is not None and smp.other_cores is not None:
        busy = smp.other_cores
        detail = (
            f"processes outside this session used {busy:.2f} of {cores} CPU(s) over "
            f"{smp.seconds:.1f} s (load average {_loads(loads)})"
        )
        if busy > limit:
            return HygieneCheck(
                "host.cpu_load", WARN, value, detail + ": another job is running", spoils=True
            )
        return HygieneCheck("host.cpu_load", OK, value, detail)
    if loads is None:
        return HygieneCheck("host.cpu_load", UNKNOWN, value, "no /proc/loadavg or /proc/stat")
    detail = f"load average {_loads(loads)} on {cores} CPU(s) (this session's own included)"
    if loads[0] > 0.75 * cores:
        return HygieneCheck(
            "host.cpu_load", WARN, value, detail + ": another job may be running", spoils=True
        )
    return HygieneCheck("host.cpu_load", OK, value, detail)


def _loads(loads: list[float] | None) -> str:
    return "n/a" if loads is None else " ".join(f"{x:.2f}" for x in loads)


def governor_check(root: Path) -> HygieneCheck:
    """The CPU frequency governor; 'powersave' slows the load generator and a CPU server."""
    cpus = root / "sys" / "devices" / "system" / "cpu"
    found: dict[str, int] = {}
    for f in sorted(cpus.glob("cpu[0-9]*/cpufreq/scaling_governor")):
        g = (read_text(f) or "").strip()
        if g:
            found[g] = found.get(g, 0) + 1
    if not found:
        return HygieneCheck(
            "host.cpu_governor",
            UNKNOWN,
            None,
            "no cpufreq governor in /sys (a VM or container hides it)",
        )
    driver = (read_text(cpus / "cpu0" / "cpufreq" / "scaling_driver") or "").strip() or None
    text = ", ".join(f"{g} on {n} CPU(s)" for g, n in sorted(found.items()))
    text += f" (driver {driver})" if driver else ""
    value = {"governors": found, "driver": driver}
    if "powersave" in found:
        hint = " (with intel_pstate it still scales, but unevenly)" if driver else ""
        return HygieneCheck(
            "host.cpu_governor",
            WARN,
            value,
            f"{text}: 'powersave' lowers CPU clocks{hint}; set 'performance' for steady numbers",
            spoils=True,
        )
    return HygieneCheck("host.cpu_governor", OK, value, text)


def _meminfo(root: Path) -> dict[str, int]:
    out = {}
    for line in (read_text(root / "proc" / "meminfo") or "").splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1]) * 1024
    return out


def memory_checks(root: Path, smp: Sample | None) -> list[HygieneCheck]:
    """Available memory (low is a warning) and swap (swapping now spoils the numbers)."""
    m = _meminfo(root)
    out = []
    total, avail = m.get("MemTotal"), m.get("MemAvailable")
    if total is None or avail is None:
        out.append(HygieneCheck("host.memory", UNKNOWN, None, "no MemAvailable in /proc/meminfo"))
    else:
        value = {"total_bytes": total, "available_bytes": avail}
        text = f"{avail / GIB:.1f} of {total / GIB:.1f} GiB available"
        low = avail < 0.1 * total or avail < 2 * GIB
        out.append(
            HygieneCheck(
                "host.memory",
                WARN if low else OK,
                value,
                text + (": little left, the machine may swap" if low else ""),
            )
        )
    swap_total, swap_free = m.get("SwapTotal"), m.get("SwapFree")
    used = None if swap_total is None or swap_free is None else swap_total - swap_free
    moved = None if smp is None else smp.swapped_pages
    window = 0.0 if smp is None else smp.seconds
    value2 = {"used_bytes": used, "pages_swapped_in_sample": moved}
    if moved:
        out.append(
            HygieneCheck(
                "host.swap",
                WARN,
                value2,
                f"{moved} page(s) swapped in/out during the {window:.1f} s "
                "check: the machine is swapping",
                spoils=True,
            )
        )
    elif used is None:
        out.append(HygieneCheck("host.swap", UNKNOWN, value2, "no SwapTotal in /proc/meminfo"))
    else:
        quiet = "" if moved is None else ", no swapping during the check"
        out.append(HygieneCheck("host.swap", OK, value2, f"{used / GIB:.2f} GiB in swap{quiet}"))
    return out
