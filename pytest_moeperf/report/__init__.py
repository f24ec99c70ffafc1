"""Plain-text and file reports of verdicts, for the terminal summary and the CLI."""
