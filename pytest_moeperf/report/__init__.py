"""Plain-text and file reports of verdicts, for the terminal summary and the CLI."""

#: The results file's format version: the session writes it and ``report.schema`` reads up to it.
#: Here, not in ``schema`` (pydantic), so that the plugin's start imports nothing heavy.
RESULTS_SCHEMA_VERSION = 1
