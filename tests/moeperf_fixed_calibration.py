"""A fixed host calibration for every pytest the test suite starts (pytester runs, in-process
or in a subprocess): ``tests/conftest.py`` names this module in ``PYTEST_PLUGINS``.

Why: measuring the host costs each session ~3 s (importing torch, then 30 GEMM and copy
repeats), and the suite starts about a hundred sessions whose subject is something else (a
fault, a setting, the report). The measurement itself is tested without this plugin:
``tests/test_calibration.py`` (``measure_host``), the tutorial and the e2e test, whose
subprocesses run with a clean environment (``tutorial_helpers.clean_env``). A session whose
conftest puts its own ``measure_host`` in place (the machine tests) keeps it.
"""

from __future__ import annotations

import pytest

#: (best rates, spreads, threads), the shape ``calibration.measure_host`` returns
FIXED = ({"gemm_gflops": 100.0, "copy_gb_s": 20.0}, {"gemm_gflops": 0.0, "copy_gb_s": 0.0}, 1)


def pytest_configure(config: pytest.Config) -> None:
    from pytest_moeperf.baseline import calibration

    if calibration.measure_host.__module__ == calibration.__name__:  # nobody replaced it
        config.stash[calibration.SESSION_KEY] = FIXED
