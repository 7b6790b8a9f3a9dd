"""The tasks tables carry the indexes their queries use and no more (tasks.0004).

Every status change adds an entry to each index of the task row, so an index a composite or
unique index already leads with, or a LIKE twin no query uses, is paid for on every task
transition for nothing (docs/decisions.md, "The task store"). Checked on the test's
PostgreSQL and, through a migration there and back, on the embedded SQLite store.
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[3]

# What each table's queries need, single-column indexes only (the composites and unique
# constraints are in the models). context_id: the management API's filter across agents;
# state: in-flight tasks on the dashboard; card_version_id: a version's SET NULL on delete;
# a dispatch's task_id: its cascade (the active-dispatch constraint covers only the active).
SINGLE_COLUMN = {
    "tasks_task": {"context_id", "state", "card_version_id"},
    "tasks_message": set(),
    "tasks_artifact": set(),
    "tasks_taskevent": set(),
    "tasks_messagereceipt": {"task_id"},
    "tasks_executordispatch": {"task_id"},
}


def single_column_indexes(cursor, table: str) -> dict[str, str]:
    constraints = connection.introspection.get_constraints(cursor, table)
    return {
        name: info["columns"][0]
        for name, info in constraints.items()
        if info["index"] and not info["unique"] and not info["primary_key"]
        if len(info["columns"]) == 1
    }


@pytest.mark.django_db
def test_postgres_keeps_only_the_single_column_indexes_queries_use():
    with connection.cursor() as cursor:
        for table, wanted in SINGLE_COLUMN.items():
            found = single_column_indexes(cursor, table)
            assert sorted(found.values()) == sorted(wanted), table
            assert not [name for name in found if name.endswith("_like")], table
        names = single_column_indexes(cursor, "tasks_task")
    assert {"task_context", "task_state"} <= names.keys()


SQLITE_CHECK = """
from django.db import connection
with connection.cursor() as cursor:
    constraints = connection.introspection.get_constraints(cursor, "tasks_task")
print(sorted(
    name for name, info in constraints.items()
    if info["index"] and not info["unique"] and len(info["columns"]) == 1
))
"""


def test_sqlite_migrates_to_the_lean_indexes_and_back(tmp_path):
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DATABASE_URL", "CELERY_BROKER_URL", "A2A_PROFILE")
    }
    env |= {"DATABASE_URL": f"sqlite:///{tmp_path / 'a2a.sqlite3'}", "A2A_VAR_DIR": str(tmp_path)}
    manage = [sys.executable, str(ROOT / "manage.py")]

    def run(*args: str) -> None:
        subprocess.run([*manage, *args], cwd=tmp_path, env=env, check=True, timeout=300)

    def indexes() -> list[str]:
        done = subprocess.run(
            [*manage, "shell", "-c", SQLITE_CHECK],
            cwd=tmp_path,
            env=env,
            check=True,
            timeout=300,
            capture_output=True,
        )
        return ast.literal_eval(done.stdout.decode().strip().splitlines()[-1])

    run("migrate", "-v0")
    lean = indexes()
    assert {"task_context", "task_state"} <= set(lean)
    assert not [name for name in lean if "agent_id" in name or "owner" in name]
    run("migrate", "tasks", "0003", "-v0")
    fat = indexes()
    assert {"tasks_task_owner_idx", "tasks_task_agent_id_idx", "tasks_task_state_idx"} <= set(fat)
    assert not {"task_context", "task_state"} & set(fat)
    run("migrate", "-v0")
    assert indexes() == lean
