"""The webhooks app's Celery job names, defined once (a leaf module: no imports), used by the
job decorators (webhooks/jobs.py) and by everything that sends, routes or schedules them."""

DELIVER_JOB = "webhooks.deliver"
SWEEP_DELIVERIES_JOB = "webhooks.sweep_deliveries"
PURGE_OLD_ROWS_JOB = "webhooks.purge_old_rows"
HEARTBEAT_JOB = "heartbeat.beat"
REBIND_MONITOR_JOB = "webhooks.rebind_monitor"
REBIND_FIRE_JOB = "webhooks.rebind_fire"
CARD_AGE_CHECK_JOB = "webhooks.card_age_check"
