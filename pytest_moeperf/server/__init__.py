"""The vLLM server: the embedded tiny model, the process, its log, and the pytest fixture."""
