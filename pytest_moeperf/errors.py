"""One exception type for bad input, so every message names the value, its source and the fix."""

from __future__ import annotations


class MoePerfError(Exception):
    """Base class for every error this plugin raises on purpose."""


class UsageError(MoePerfError):
    """Bad input from a user: a marker, an option, a spec, a config or a baseline file.

    The message always reads ``<source>: <what> = <value!r>: <problem>. <fix>`` so that one line
    in a CI log is enough to find and repair the input.
    """

    def __init__(self, source: str, what: str, value: object, problem: str, fix: str) -> None:
        self.source = source
        self.what = what
        self.value = value
        self.problem = problem
        self.fix = fix
        super().__init__(f"{source}: {what} = {value!r}: {problem}. Fix: {fix}")


class ServerError(MoePerfError):
    """The vLLM server failed to start, died, or never became healthy.

    Carries the command line and the tail of the server log so the test failure is self-contained.
    """

    def __init__(self, message: str, command: list[str] | None = None, log_tail: str = "") -> None:
        self.command = command or []
        self.log_tail = log_tail
        parts = [message]
        if command:
            parts.append("command: " + " ".join(command))
        if log_tail:
            parts.append("--- server log (last lines) ---\n" + log_tail)
        super().__init__("\n".join(parts))


class GateFailure(MoePerfError):
    """A run that measured, and a gate said no (the SLO, the baseline, accuracy, the A/B
    verdict): the reasons on one line. The flow raises it rather than ``pytest.fail``, so it
    does not need pytest to run; the plugin shows it as the test's failure, without a
    traceback. The result was recorded before it is raised."""
