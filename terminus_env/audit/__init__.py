"""Find the tasks a policy can pass without solving them: a catalogue of generic exploits, each a scripted policy
that sees only the instruction and the container, played against every task before training finds them.

``terminus-env tasks audit`` plays them (:mod:`terminus_env.audit.play`) and writes the report
(:mod:`terminus_env.audit.report`); :mod:`terminus_env.audit.screen` applies a report to a suite, for eval and the
trainers. This module imports only the report's side, so readers of a report need no Docker.
"""

from terminus_env.audit.report import AuditReport, AuditReportError, ExploitResult, TaskAudit
from terminus_env.audit.screen import Hackable, screen_tasks

__all__ = ["AuditReport", "AuditReportError", "ExploitResult", "Hackable", "TaskAudit", "screen_tasks"]
