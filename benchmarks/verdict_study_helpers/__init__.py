"""Helpers of ``benchmarks/verdict_study.py`` that run inside other processes.

* ``step_delay``: a vLLM general plugin that makes every engine step x % slower (a sleep of x
  times the step's own compute time), loaded by the vLLM server through a ``*.dist-info`` on its
  ``PYTHONPATH``; with no fraction set it does nothing.
* ``capture``: a pytest plugin (``-p verdict_study_helpers.capture``) that writes the
  per-request records of every search probe to a JSON-lines file, tagged with the run and probe
  numbers, so the study can resample them; it measures nothing and changes no result.
"""
