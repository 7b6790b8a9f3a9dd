"""The tasks app's Celery job names, defined once: the jobs' decorators (tasks/jobs.py), the
senders, the queue routes and the beat schedules all use these. No Django import, so the Celery
app's configuration (a2a_platform/celery.py) may import it before the apps load.
"""

from __future__ import annotations

# Runs one executor dispatch (queue `agents`); sent after commit by tasks/dispatch.py.
RUN_EXECUTOR_JOB = "tasks.run_executor"
# Runs the quick executors' due dispatches, many per job (queue `agents`); published when a
# new such dispatch rings the doorbell (tasks/dispatch.py).
RUN_DUE_DISPATCHES_JOB = "tasks.run_due_dispatches"
# Claims the due dispatches of hosted executors for this worker's host (queue `agents`), many
# per job; published when a new such dispatch rings the doorbell (tasks/dispatch.py).
RUN_DUE_HOSTED_JOB = "tasks.run_due_hosted"
# The dispatch sweeper on beat (queue `heartbeat`): tasks/sweeper.dispatch_sweep.
SWEEP_DISPATCHES_JOB = "tasks.sweep_dispatches"
