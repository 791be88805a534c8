"""What a run leaves, for trainers and for people: built on the rollout core, read by the commands and the viewer.

Per-batch figures (``metrics``) and a training run's step log (``step_log``); an eval's run file (``run_log``), its
statistics (``stats``), report (``report``) and progress display (``progress``); the run in Harbor's job layout
(``harbor_job`` with ``harbor_records``, ``atif`` for the ATIF trajectory, ``cast`` for the asciinema recording and
``timeline`` for their times).
"""
