"""On-policy distillation's teacher: the ``teacher:`` config section, the teacher role's engine spec, and
the start-up checks of the teacher's folder and tokenizer.

The algorithm itself is a flow (:mod:`rlcore.flows.opd`) over pure tensor functions
(:mod:`rlcore.algorithms.distill`); this room holds what the teacher role needs. Light to import (the
config schema imports it; no torch).
"""

from rlcore.distill.config import ROLE, TeacherConfig, teacher_engine, teacher_spec

__all__ = ["ROLE", "TeacherConfig", "teacher_engine", "teacher_spec"]
