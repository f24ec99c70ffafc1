"""One perf test's run: plan, SLO boundary search, probes, measurement and the result record.

The step that ties the others together: it drives ``load`` (traffic), reads ``metrics`` and
``energy``, and hands the result to ``baseline``, ``verdict`` and ``report``. Nothing below it
imports it, so ``load`` and ``metrics`` stay free of each other's orchestration.
"""
