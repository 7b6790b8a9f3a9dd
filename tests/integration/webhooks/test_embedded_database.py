"""The outbox on the embedded database of `make run` (SQLite, file-system broker), in a
process of its own: lifecycle writes, then registration writes the snapshot, a claim signs it,
a record delivers it, and the next claim finds nothing (webhooks/delivery/outbox_store/
orm.py's OrmOutboxStore and tasks/task_store/orm.py's OrmTaskStore for real, where
test_outbox.py and test_services.py run them on PostgreSQL)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = """
import json
from django.db import connection
from tasks import services, task_store
from tasks.models import TaskEvent
from tests.factories import AgentFactory, task_create, user_message
from webhooks.delivery import outbox_store
from webhooks.delivery.claim_record import delivery_claim_batch, delivery_record_many
from webhooks.models import Delivery, DeliveryAttempt
from webhooks.services import push_config_create
from webhooks.delivery.transport import TransportResult

agent = AgentFactory(executor="external")
task = task_create(agent=agent, owner="o", message=user_message("hi"))
services.task_transition(task_id=task.pk, to_state="TASK_STATE_WORKING", message="on it")
for i in range(2):
    services.task_add_artifact(
        task_id=task.pk, artifact={"artifactId": "a", "parts": [{"text": str(i)}]}, append=i > 0
    )
push_config_create(
    task=task,
    config={"id": "c", "url": "http://127.0.0.1:9/hook", "authentication": {"scheme": "Bearer"}},
)
claims = delivery_claim_batch(limit=10).claims
ok = TransportResult(200, {}, "", 1.0, None, None)
outcomes = delivery_record_many([(claim, ok) for claim in claims])
print(json.dumps({
    "vendor": connection.vendor,
    "store": type(outbox_store.get_outbox_store()).__name__,
    "task_store": type(task_store.get_task_store()).__name__,
    "events": list(TaskEvent.objects.order_by("seq").values_list("seq", "kind")),
    "artifact": task.artifacts.get().parts,
    "status": task.__class__.objects.get(pk=task.pk).status_message["parts"],
    "headers": sorted(claims[0].headers) if claims else [],
    "outcomes": [o.state for o in outcomes],
    "deliveries": list(Delivery.objects.values_list("state", "attempts")),
    "attempts": list(DeliveryAttempt.objects.values_list("number", "status")),
    "again": len(delivery_claim_batch(limit=10).claims),
}))
"""


def test_make_runs_embedded_database_claims_signs_and_records(tmp_path):
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DATABASE_URL", "CELERY_BROKER_URL", "A2A_PROFILE")
    }
    env |= {
        "DATABASE_URL": f"sqlite:///{tmp_path / 'a2a.sqlite3'}",
        "A2A_VAR_DIR": str(tmp_path),
        "A2A_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8",
    }
    manage = [sys.executable, str(ROOT / "manage.py")]
    elsewhere = tmp_path / "cwd"  # the broker writes under A2A_VAR_DIR, never where it started
    elsewhere.mkdir()
    subprocess.run([*manage, "migrate", "-v0"], cwd=elsewhere, env=env, check=True, timeout=300)
    done = subprocess.run(
        [*manage, "shell", "-c", SCRIPT],
        cwd=elsewhere,
        env=env,
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])

    assert result["vendor"] == "sqlite"
    assert result["store"] == "OrmOutboxStore"
    assert result["task_store"] == "OrmTaskStore"
    assert result["events"] == [[1, "status"], [2, "status"], [3, "artifact"], [4, "artifact"]]
    assert result["artifact"] == [{"text": "0"}, {"text": "1"}]
    assert result["status"] == [{"text": "on it"}]
    assert {"webhook-id", "webhook-signature", "Authorization", "X-A2A-Task-Seq"} <= set(
        result["headers"]
    )
    assert result["outcomes"] == ["delivered"]
    assert result["deliveries"] == [["delivered", 1]]
    assert result["attempts"] == [[1, 200]]
    assert result["again"] == 0
    assert list(elsewhere.iterdir()) == []
    assert list((tmp_path / "broker" / "control").glob("*.exchange"))
