"""Benchmark scripts (run as files, ``python benchmarks/<name>.py``) and the GPU harness (``python -m benchmarks.gpu``)."""
