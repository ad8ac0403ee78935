"""Helpers shared by the tests and the benchmarks: synthetic and labelled clips, the GPU-readiness checks,
the kill harness for checkpoint writers, a headless browser, peers written for comparison.

Imported as ``tests.support.<module>``: pytest puts the checkout root on ``sys.path``
(``pythonpath`` in pyproject.toml); scripts in ``bench/`` run from the root as ``python -m bench.<name>``.
Nothing here is shipped in the wheel.
"""
