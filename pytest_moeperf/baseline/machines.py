"""One baseline per machine: which of a key's files belongs to the machine a run is on.

A key names the hardware and software (``baseline/key.py``); its calibration says which
machine of those names measured it. Two machines with the same names keep a file each:
``<slug>.json`` for the first, ``<slug>.m2.json``, ``<slug>.m3.json`` ... beside it. A run reads
the file whose calibration matches its own; a refresh writes there, or beside the others when
none matches. Before, a refresh on machine B replaced machine A's file, and the two machines'
runs took turns calling each other's baseline "another machine" (two H100 hosts, 2026-12-06:
copy 63.6 vs 180 GB/s and a boundary 39 % apart, docs/results/h100-second-night-2026-12-06).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

from pytest_moeperf.baseline.calibration import Calibration, differences

#: Each machine's file of one key with that file's calibration (None: recorded before
#: calibrations), in machine order.
MachineFiles = Sequence[tuple[Path, Calibration | None]]


def machine_index(path: Path, slug: str) -> int | None:
    """1 for ``<slug>.json``, N for ``<slug>.mN.json`` (N >= 2), None for any other file."""
    if path.name == f"{slug}.json":
        return 1
    m = re.fullmatch(re.escape(slug) + r"\.m([1-9][0-9]*)\.json", path.name)
    return int(m.group(1)) if m and int(m.group(1)) >= 2 else None


def machine_paths(folder: Path, slug: str) -> list[Path]:
    """Each machine's file of ``slug`` in ``folder``, in machine order."""
    if not folder.is_dir():
        return []
    found = sorted((i, p) for p in folder.glob("*.json")
                   if (i := machine_index(p, slug)) is not None)  # fmt: skip
    return [p for _, p in found]


def machine_path(folder: Path, slug: str, index: int) -> Path:
    return folder / (f"{slug}.json" if index == 1 else f"{slug}.m{index}.json")


def gap(here: Calibration, there: Calibration) -> float:
    """How far apart two machines are: the summed |log ratio| of the host figures both have,
    plus 100 for each difference that is not a figure (method, threads, a GPU field)."""
    logs = [abs(math.log(a / b)) for k, a in here.figures.items()
            if (b := there.figures.get(k)) and a > 0 and b > 0]  # fmt: skip
    return sum(logs) + 100.0 * len(differences(here, there, tolerance=math.inf))


def for_reading(here: Calibration | None, files: MachineFiles) -> Path | None:
    """The file a run on ``here`` is compared with: the closest matching machine's; with none
    matching, the closest other machine's (the gate then says "another machine" and names both
    figures); an uncalibrated file last. ``here`` None (a remote server): the first, by names."""
    if not files:
        return None
    if here is None:
        return files[0][0]
    calibrated = _calibrated(files)
    pool = [(p, c) for p, c in calibrated if not differences(here, c)] or calibrated
    if not pool:
        return files[0][0]
    return min(pool, key=lambda pc: gap(here, pc[1]))[0]


def for_writing(here: Calibration | None, files: MachineFiles, folder: Path, slug: str) -> Path:
    """Where a refresh on ``here`` writes: the matching machine's file (replaced), else an
    uncalibrated one (it asked to be re-recorded), else a new file beside the other machines'.
    ``here`` None (a remote server: names only): the first file, as before machines had files."""
    if here is None or not files:
        return files[0][0] if files else machine_path(folder, slug, 1)
    same = [(p, c) for p, c in _calibrated(files) if not differences(here, c)]
    if same:
        return min(same, key=lambda pc: gap(here, pc[1]))[0]
    uncalibrated = [p for p, c in files if c is None]
    if uncalibrated:
        return uncalibrated[0]
    taken = {machine_index(p, slug) or 1 for p, _ in files}
    return machine_path(folder, slug, max(taken) + 1)


def _calibrated(files: MachineFiles) -> list[tuple[Path, Calibration]]:
    return [(p, c) for p, c in files if c is not None]
