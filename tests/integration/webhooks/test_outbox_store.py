"""The outbox store's contract: each `OutboxStore` method, called on both implementations
(`PgOutboxStore`'s prepared SQL and `OrmOutboxStore`) against PostgreSQL from the same rows,
returns the same value and leaves the same rows; the switch (`get_outbox_store`) follows
`settings.A2A_STORE`; and the PostgreSQL inserts name every field a row needs (schema drift).

Each call runs in a savepoint that is rolled back, so both stores start from the same rows;
time is frozen, so the ORM's `auto_now_add` stamps equal the statements' `now`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, models, transaction

from tests.factories import AgentFactory, task_create, user_message
from webhooks.delivery import outbox_store
from webhooks.delivery.outbox_store import (
    AttemptResult,
    NewAttempt,
    OrmOutboxStore,
    OutboxEvent,
    PgOutboxStore,
    get_outbox_store,
    postgres,
)
from webhooks.delivery.outbox_store.postgres import _insert_fields
from webhooks.models import Delivery, DeliveryAttempt, DeliveryState, Endpoint, PushConfig
from webhooks.services import push_config_create

pytestmark = pytest.mark.usefixtures("public_dns")

T0 = datetime(2030, 1, 15, 12, 0, tzinfo=UTC)
STORES = {"postgres": PgOutboxStore(), "orm": OrmOutboxStore()}


@pytest.fixture
def clock(time_machine):
    time_machine.move_to(T0, tick=False)
    return time_machine


def register(task, config_id: str, url: str) -> PushConfig:
    return push_config_create(task=task, config={"id": config_id, "url": url}).config


def head(push: PushConfig) -> Delivery:
    return Delivery.objects.filter(config=push).order_by("id").first()


@pytest.fixture
def outbox(db, clock):
    """Two tasks, four configs on two endpoints, in every state a claim tells apart:

    - `retried`: its head pending since a second ago, after one earlier try;
    - `parked`: its head due, on endpoint b, which is paused;
    - `in_flight`: on endpoint b, its head sending with a live lease (b's one in flight);
    - `empty`: due, but owing nothing (its snapshot delivered);
    - `later`: its head due in a minute.
    """
    agent = AgentFactory(executor="external")
    task = task_create(agent=agent, owner="o", message=user_message("hi"))
    other = task_create(agent=agent, owner="o", message=user_message("hi"))
    pushes = {
        "retried": register(task, "retried", "https://a.example.org/hook"),
        "parked": register(task, "parked", "https://b.example.org/hook"),
        "empty": register(task, "empty", "https://a.example.org/other"),
        "later": register(task, "later", "https://a.example.org/later"),
        "in_flight": register(other, "in-flight", "https://b.example.org/hook"),
    }
    earlier = T0 - timedelta(seconds=1)
    retried = head(pushes["retried"])
    Delivery.objects.filter(pk=retried.pk).update(attempts=1, next_attempt_at=earlier)
    DeliveryAttempt.objects.create(delivery=retried, number=1, url="u", started_at=earlier)
    PushConfig.objects.filter(pk=pushes["retried"].pk).update(head_due_at=earlier)
    Endpoint.objects.filter(origin="https://b.example.org:443").update(paused_at=earlier)
    sending = head(pushes["in_flight"])
    lease = T0 + timedelta(seconds=30)
    Delivery.objects.filter(pk=sending.pk).update(
        state=DeliveryState.SENDING, attempts=1, next_attempt_at=lease
    )
    DeliveryAttempt.objects.create(delivery=sending, number=1, url="u", started_at=earlier)
    PushConfig.objects.filter(pk=pushes["in_flight"].pk).update(head_due_at=lease)
    Delivery.objects.filter(config=pushes["empty"]).update(
        state=DeliveryState.DELIVERED, finished_at=earlier
    )
    later = T0 + timedelta(minutes=1)
    Delivery.objects.filter(config=pushes["later"]).update(next_attempt_at=later)
    PushConfig.objects.filter(pk=pushes["later"].pk).update(head_due_at=later)
    return task, pushes


def rows() -> dict[str, list]:
    """Every row a store writes, without the ids and event ids a database hands out."""
    delivery_fields = [
        f.attname for f in Delivery._meta.concrete_fields if f.name not in ("id", "event_id")
    ]
    attempt_fields = [f.attname for f in DeliveryAttempt._meta.concrete_fields if f.name != "id"]
    return {
        "deliveries": list(
            Delivery.objects.order_by("config_id", "seq", "kind", "id").values_list(
                *delivery_fields
            )
        ),
        "event_ids": [Delivery.objects.values("event_id").distinct().count()],
        "attempts": list(
            DeliveryAttempt.objects.order_by("delivery_id", "number").values_list(*attempt_fields)
        ),
        "configs": list(PushConfig.objects.order_by("pk").values_list("pk", "head_due_at")),
    }


def both(call) -> dict[str, tuple[object, dict[str, list]]]:
    """`call(store)` on each store from the same rows: its value and the rows it left."""
    seen = {}
    for name, store in STORES.items():
        with transaction.atomic():
            value = call(store)
            seen[name] = (value, rows())
            transaction.set_rollback(True)
    return seen


def assert_same(seen) -> tuple[object, dict[str, list]]:
    assert seen["postgres"][0] == seen["orm"][0]
    for table, postgres_rows in seen["postgres"][1].items():
        assert postgres_rows == seen["orm"][1][table], table
    return seen["postgres"]


def test_outbox_write_writes_one_delivery_per_current_binding_in_both(outbox):
    task, pushes = outbox
    before = Delivery.objects.count()

    written, after = assert_same(
        both(lambda store: store.outbox_write([OutboxEvent(task.pk, 7, "status", '{"s":1}')], T0))
    )

    assert written == 4  # the task's four configs; the other task's is not owed
    assert len(after["deliveries"]) == before + 4
    assert after["event_ids"] == [before + 4]
    owed = {row[0] for row in after["configs"] if row[1] is not None}
    assert pushes["empty"].pk in owed  # nothing was scheduled: due now


def test_outbox_write_of_several_events_numbers_each_configs_deliveries_in_event_order(outbox):
    task, _ = outbox
    events = [
        OutboxEvent(task.pk, 7, "status", '{"s":7}'),
        OutboxEvent(task.pk, 8, "artifact", '{"s":8}'),
    ]
    events.append(OutboxEvent(task.pk, 9, "status", '{"s":9}'))
    before = Delivery.objects.count()

    def write(store) -> tuple[int, list[list[int]]]:
        written = store.outbox_write(events, T0)
        by_config: dict[int, list[int]] = {}
        rows = Delivery.objects.filter(task=task, seq__gte=7).order_by("config_id", "id")
        for config_pk, seq in rows.values_list("config_id", "seq"):
            by_config.setdefault(config_pk, []).append(seq)
        return written, list(by_config.values())

    (written, seqs_by_id), after = assert_same(both(write))

    assert written == 4  # configs owed, however many events
    assert seqs_by_id == [[7, 8, 9]] * 4  # each config's delivery ids follow its events
    assert len(after["deliveries"]) == before + 12


def test_outbox_write_of_several_tasks_owes_each_event_to_its_own_tasks_configs(outbox):
    # A batch's events (tasks.hooks.hooks_together): two tasks' events interleaved with one
    # of a task without configs, in one call; each config gets its own task's, in order.
    task, pushes = outbox
    other = pushes["in_flight"].task_id
    lone = task_create(agent=task.agent, owner="o", message=user_message("no configs")).pk
    before = Delivery.objects.order_by("id").last().pk
    events = [
        OutboxEvent(task.pk, 7, "status", '{"t":7}'),
        OutboxEvent(other, 2, "status", '{"o":2}'),
        OutboxEvent(lone, 2, "status", '{"l":2}'),
        OutboxEvent(task.pk, 8, "artifact", '{"t":8}'),
        OutboxEvent(other, 3, "artifact", '{"o":3}'),
    ]

    def write(store) -> tuple[int, dict[int, list[tuple]]]:
        written = store.outbox_write(events, T0)
        by_config: dict[int, list[tuple]] = {}
        rows = Delivery.objects.filter(pk__gt=before).order_by("id")
        for config_pk, task_pk, seq, body in rows.values_list(
            "config_id", "task_id", "seq", "body"
        ):
            by_config.setdefault(config_pk, []).append((task_pk, seq, body))
        return written, by_config

    (written, by_config), _ = assert_same(both(write))

    assert written == 5  # the first task's four configs and the other's one
    mine = [(task.pk, 7, '{"t":7}'), (task.pk, 8, '{"t":8}')]
    assert {pk: by_config[pk] for pk in by_config if pk != pushes["in_flight"].pk} == {
        push.pk: mine for name, push in pushes.items() if name != "in_flight"
    }
    assert by_config[pushes["in_flight"].pk] == [(other, 2, '{"o":2}'), (other, 3, '{"o":3}')]


def test_claim_read_reads_the_same_heads_in_both(outbox):
    _, pushes = outbox

    heads, _ = assert_same(both(lambda store: store.claim_read(T0, 10, None)))

    by_config = {h.config_pk: h for h in heads}
    assert set(by_config) == {pushes[name].pk for name in ("retried", "parked", "empty")}
    assert heads[-1] == outbox_store.Head(pushes["empty"].pk, None)
    assert by_config[pushes["retried"].pk].earlier_attempts == 1
    assert by_config[pushes["parked"].pk].paused
    assert by_config[pushes["parked"].pk].endpoint_in_flight == 1


def test_claim_read_of_named_configs_and_a_limit_in_both(outbox):
    _, pushes = outbox
    only = [pushes["parked"].pk, pushes["later"].pk]

    named, _ = assert_same(both(lambda store: store.claim_read(T0, 10, only)))
    limited, _ = assert_same(both(lambda store: store.claim_read(T0, 1, None)))

    assert [h.config_pk for h in named] == [pushes["parked"].pk]
    assert [h.config_pk for h in limited] == [pushes["retried"].pk]  # the longest waiting


def test_claim_write_leases_and_inserts_attempts_in_both(outbox):
    _, pushes = outbox
    retried = head(pushes["retried"])
    leased_until = T0 + timedelta(seconds=20)
    due = {pushes["retried"].pk: leased_until, pushes["parked"].pk: None}
    attempts = [NewAttempt(retried.pk, 2, "https://a.example.org/hook", {"h": "v"}, True)]

    def claim_write(store):
        made = store.claim_write(T0, leased_until, due, attempts)
        return {pk: DeliveryAttempt.objects.get(pk=attempt).number for pk, attempt in made.items()}

    made, after = assert_same(both(claim_write))

    assert made == {retried.pk: 2}
    assert dict(after["configs"])[pushes["parked"].pk] is None
    leased = Delivery.objects.filter(pk=retried.pk)
    assert leased.get().state == DeliveryState.PENDING  # rolled back after each store


def test_record_read_reads_the_same_rows_in_both(outbox):
    _, pushes = outbox
    pks = [head(pushes["retried"]).pk, head(pushes["in_flight"]).pk]

    recorded, _ = assert_same(both(lambda store: store.record_read(pks)))

    assert {pk: row.state for pk, row in recorded.items()} == {
        pks[0]: DeliveryState.PENDING,
        pks[1]: DeliveryState.SENDING,
    }


def test_record_write_writes_outcomes_and_head_times_in_both(outbox):
    _, pushes = outbox
    sending = head(pushes["in_flight"])
    attempt = DeliveryAttempt.objects.get(delivery=sending)
    results = [AttemptResult(attempt.pk, 3.5, 200, "", "ok")]
    configs = [pushes["retried"].pk, pushes["in_flight"].pk]

    due_now, after = assert_same(
        both(lambda store: store.record_write(T0, results, [(sending.pk, 200)], configs))
    )

    assert due_now == {pushes["retried"].pk}  # its head is a second late; in_flight owes none
    assert dict(after["configs"])[pushes["in_flight"].pk] is None
    written = [row for row in after["attempts"] if row[0] == sending.pk]
    assert [(row[4], row[5], row[7]) for row in written] == [(3.5, 200, "ok")]


@pytest.mark.parametrize(
    ("setting", "expected"),
    [("auto", PgOutboxStore), ("orm", OrmOutboxStore), ("postgres", PgOutboxStore)],
)
def test_get_outbox_store_follows_the_setting(settings, setting, expected):
    settings.A2A_STORE = setting
    assert isinstance(get_outbox_store(), expected)


def test_get_outbox_store_refuses_postgres_on_another_database(settings, monkeypatch):
    monkeypatch.setattr(connection, "vendor", "sqlite")
    settings.A2A_STORE = "auto"
    assert isinstance(get_outbox_store(), OrmOutboxStore)
    settings.A2A_STORE = "postgres"
    with pytest.raises(ImproperlyConfigured):
        get_outbox_store()


def statements() -> dict[str, str]:
    """The PostgreSQL store's statements by name (what the schema-drift test reads)."""
    return {
        "outbox_write": postgres._outbox_write_sql(),
        "claim_read": postgres._claim_read_sql(),
        "claim_write": postgres._claim_write_sql(),
        "record_read": postgres._record_read_sql(),
        "record_write": postgres._record_write_sql(),
    }


def _inserted_columns(table: str) -> set[str]:
    found = set()
    for sql in statements().values():
        for columns in re.findall(rf"INSERT INTO {table} \(([^)]*)\)", sql):
            found |= {c.strip() for c in columns.split(",")}
    return found


@pytest.mark.parametrize("model", [Delivery, DeliveryAttempt])
def test_postgres_inserts_name_every_required_field(model):
    """Schema drift: a concrete, non-nullable field without a default that the PostgreSQL
    insert leaves out would fail every insert there (or, with a database default, differ from
    the ORM twin) while the ORM store still passes."""
    required = {
        f.column
        for f in model._meta.concrete_fields
        if not isinstance(f, models.AutoField) and not f.null and not f.has_default()
    }
    assert required  # the test looks at something
    assert required <= _inserted_columns(model._meta.db_table)


def test_an_insert_leaving_out_a_required_field_is_refused():
    with pytest.raises(ImproperlyConfigured, match="missing"):
        _insert_fields(DeliveryAttempt, {"delivery": "1", "number": "1"})
