"""The GPU harness: every GPU row of ``docs/benchmarks.md`` as a named stage, and the device calls that run it.

``python -m benchmarks.gpu list`` shows the stages, ``plan STAGE ...`` the calls to make, ``bundle NAME`` builds
an offline bundle here; on the lent machine ``python3 -m benchmarks.gpu STAGE ...`` runs them. README.md beside
this file says how. Standard library only: the same modules run on the CPU machine and on the GPU machine.
"""
