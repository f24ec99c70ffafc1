"""pytest-moeperf: performance regression testing of vLLM servers and fused-MoE kernel configs.

Import stays light on purpose: this module is imported by pytest at start-up for every test
session, so heavy dependencies (numpy, scipy, httpx, vllm, pynvml) are imported inside the
functions and hooks that use them.
"""

__version__ = "0.1.0"
