"""Rebinds proven by a model (Hypothesis `RuleBasedStateMachine`), on the path users take.

Rules open tasks through the protocol (SendMessage with a push config, both bindings),
register, re-register and delete configs through the protocol, move tasks through their
states as an agent backend does, run every kind of rebind with the operator's command
(`rebind start|advance|cutover|abort|extend|rebind-orphans`: rotate, move a prefix, one
config; drain, cutover, finish-on-old), deliver with the production pump over HTTP, and make
the receiver accept, refuse or go down. The receiver is the strict one of
docs/webhooks-receiving.md §5 (`WebhookVerifier` + `ChannelTrust`, the JWKS URL read from
the agent's card); it records every answer.

After every step the invariants below hold (docs/rebinds.md, "Any sequence of operations").
Each example has an agent of its own, so examples share the database without meeting.
`make test` runs a bounded number of examples, the same ones each run; `make test-deep`
(A2A_MODEL_EXAMPLES, A2A_MODEL_STEPS, A2A_MODEL_RANDOM) runs many more, new ones each run.
"""

from __future__ import annotations

import contextlib
import json
import os

import pytest
from django.db.models import F, Q
from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from agents.card_render import PUSH_CHANNEL_URI
from tasks import services as task_services
from tasks.errors import IllegalTransition
from tasks.models import Task
from tasks.states import TERMINAL_VALUES, TaskState
from tests import protocol_push
from tests.factories import AgentFactory
from tests.protocol_push import card_jwks_url
from tests.strict_receiver import StrictReceiver, command
from webhooks.delivery.pump import run_pump
from webhooks.models import (
    ChannelMove,
    Delivery,
    DeliveryAttempt,
    DeliveryState,
    MoveState,
    PushBinding,
    PushConfig,
    Rebind,
    RebindState,
)
from webhooks.rebinds import console as rebind_console
from webhooks.rebinds import operations as rebinds
from webhooks.selectors import rebind_counts, rebind_stragglers

pytestmark = [pytest.mark.django_db(transaction=True)]

EXAMPLES = int(os.environ.get("A2A_MODEL_EXAMPLES", "12"))
STEPS = int(os.environ.get("A2A_MODEL_STEPS", "25"))
PREFIXES = ("/hooks/v1/", "/hooks/v2/", "/hooks/v3/")


class RebindModel(RuleBasedStateMachine):
    tasks = Bundle("tasks")
    counter = 0

    @initialize()
    def agent(self) -> None:
        RebindModel.counter += 1
        # A fresh agent per example (by slug: the default agent's path is the walk's, in
        # test_rebind_walk.py); its card max-age of 0 lets a rotation's key sign at once (the
        # overlap is the card's max-age), so no step waits.
        self.agent_row = AgentFactory(
            slug=f"model-{RebindModel.counter}",
            executor="external",
            card_max_age=0,
            push_rebind_min_overlap=0,
        )
        self.receiver = StrictReceiver(card_jwks_url(self.agent_row))
        self.deleted: set[str] = set()  # tasks whose config the client deleted
        self.opened = 0

    def teardown(self) -> None:
        receiver = getattr(self, "receiver", None)
        if receiver is not None:
            receiver.stop()

    # --- clients ------------------------------------------------------------------------

    def _url(self, prefix: str, n: int) -> str:
        return f"{self.receiver.origin}{prefix}task-{n}"

    @rule(
        target=tasks,
        binding=st.sampled_from([protocol_push.JSONRPC, protocol_push.REST]),
        prefix=st.sampled_from(PREFIXES),
    )
    def open_task(self, binding: str, prefix: str) -> str:
        self.opened += 1
        return protocol_push.open_task(
            self.agent_row,
            push={"id": "cfg", "url": self._url(prefix, self.opened)},
            binding=binding,
        )

    @rule(task=tasks, prefix=st.sampled_from(PREFIXES))
    def reregister(self, task: str, prefix: str) -> None:
        if task in self.deleted:
            # The client registers again what it deleted: a new channel it chose itself, so
            # it drops what it trusted for the task (docs §5, "With ChannelTrust").
            self.receiver.trust.forget_task(task)
            self.deleted.discard(task)
        protocol_push.register(self.agent_row, task, {"id": "cfg", "url": self._url(prefix, 0)})

    @rule(task=tasks)
    def delete_config(self, task: str) -> None:
        protocol_push.delete(self.agent_row, task, "cfg")
        self.deleted.add(task)

    @rule(
        task=tasks,
        state=st.sampled_from(
            [TaskState.WORKING, TaskState.INPUT_REQUIRED, TaskState.COMPLETED, TaskState.FAILED]
        ),
    )
    def transition(self, task: str, state: TaskState) -> None:
        with contextlib.suppress(IllegalTransition):  # a finished task stays finished
            task_services.task_transition(task_id=task, to_state=state)

    @rule(mode=st.sampled_from(["accept", "accept", "refuse", "down"]))
    def receiver_mode(self, mode: str) -> None:
        self.receiver.mode = mode

    @rule()
    def deliver(self) -> None:
        run_pump()

    # --- operators ----------------------------------------------------------------------

    @rule(
        rotate=st.booleans(),
        move=st.sampled_from([None, (0, 1), (1, 2), (1, 0)]),
        one_config=st.booleans(),
        policy=st.sampled_from(["drain", "drain", "cutover"]),
        finish_on_old=st.booleans(),
        force=st.booleans(),
        data=st.data(),
    )
    def start_rebind(self, rotate, move, one_config, policy, finish_on_old, force, data) -> None:
        args = ["start", self.agent_row.slug, "--policy", policy]
        if rotate:
            args.append("--rotate-key")
        if one_config:
            configs = list(
                PushConfig.objects.filter(
                    task__agent=self.agent_row, deleted_at__isnull=True
                ).values_list("task_id", "config_id")
            )
            assume(configs)
            task_id, config_id = data.draw(st.sampled_from(configs))
            args += ["--config", str(task_id), config_id, "--url", self._url(PREFIXES[2], 99)]
        elif move is not None:
            old, new = (self.receiver.origin + PREFIXES[i] for i in move)
            args += ["--move-prefix", old, new]
        elif not rotate:
            return
        if finish_on_old and policy == "drain":
            args.append("--finish-on-old")
        if force:
            args.append("--force")
        command(*args)

    def _some_rebind(self, data) -> str | None:
        ids = list(
            Rebind.objects.filter(agent=self.agent_row)
            .order_by("created_at")
            .values_list("pk", flat=True)
        )
        return str(data.draw(st.sampled_from(ids))) if ids else None

    @rule(
        action=st.sampled_from(
            ["advance", "advance", "cutover", "abort", "extend", "rebind-orphans"]
        ),
        data=st.data(),
    )
    def drive(self, action: str, data) -> None:
        pk = self._some_rebind(data)
        assume(pk is not None)
        extra = {"abort": ["--reason", "model"], "extend": ["--by", "1h"]}.get(action, [])
        command(action, pk, *extra)

    @rule(data=st.data())
    def move_now_or_finish_on_old(self, data) -> None:
        moves = list(
            ChannelMove.objects.filter(
                rebind__agent=self.agent_row, rebind__state=RebindState.DRAINING
            )
            .filter(state__in=[MoveState.NOTICE_PENDING, MoveState.FINISHING_ON_OLD])
            .values_list("rebind_id", "pk")
        )
        assume(moves)
        rebind_pk, move_pk = data.draw(st.sampled_from(moves))
        step = data.draw(
            st.sampled_from([rebinds.rebind_moves_now, rebinds.rebind_moves_finish_on_old])
        )
        with contextlib.suppress(rebinds.RebindInvalid):  # a documented refusal
            step(rebind_pk, move_pks=[move_pk], actor="model")

    # --- invariants ---------------------------------------------------------------------

    def _bindings(self):
        return PushBinding.objects.filter(config__task__agent=self.agent_row)

    @invariant()
    def no_version_activated_after_it_was_retired(self) -> None:
        if not hasattr(self, "agent_row"):
            return
        bad = self._bindings().filter(activated_at__gt=F("retired_at"))
        assert not bad.exists(), list(bad.values("pk", "version", "activated_at", "retired_at"))

    @invariant()
    def nothing_sent_on_a_version_it_was_not_written_for(self) -> None:
        """No attempt on a version never activated (what is held is never sent), and on a
        retired version only what was written before it retired, or a move's notice."""
        if not hasattr(self, "agent_row"):
            return
        attempts = DeliveryAttempt.objects.filter(
            delivery__binding__config__task__agent=self.agent_row
        )
        never_active = attempts.filter(delivery__binding__activated_at__isnull=True)
        assert not never_active.exists(), list(never_active.values("delivery_id", "url"))
        late = (
            attempts.filter(delivery__created_at__gt=F("delivery__binding__retired_at"))
            .exclude(delivery__kind="notice")
            .values("delivery_id", "delivery__kind", "delivery__binding_id")
        )
        assert not late.exists(), list(late)
        notices = Delivery.objects.filter(
            binding__config__task__agent=self.agent_row, kind="notice"
        )
        # A notice is its move's; one left without (an operator moved a task finishing on
        # old, which replaces its withdrawn move) was withdrawn and is never sent again.
        stray = notices.exclude(pk__in=ChannelMove.objects.values("notice_id")).exclude(
            state__in=[DeliveryState.SUPERSEDED, DeliveryState.CANCELED]
        )
        assert not stray.exists(), list(stray.values("pk", "binding_id", "state"))

    @invariant()
    def every_task_in_flight_is_on_one_channel_or_orphaned(self) -> None:
        if not hasattr(self, "agent_row"):
            return
        configs = PushConfig.objects.filter(
            task__agent=self.agent_row, deleted_at__isnull=True
        ).exclude(task__state__in=TERMINAL_VALUES)
        for config in configs.select_related("task"):
            current = list(config.bindings.filter(retired_at__isnull=True))
            assert len(current) == 1, (config.config_id, [(b.pk, b.version) for b in current])
            [binding] = current
            if binding.activated_at is not None:
                continue
            move = ChannelMove.objects.filter(new_binding=binding).order_by("-id").first()
            assert move is not None, f"version {binding.version} waits for no move"
            assert move.state in (MoveState.NOTICE_PENDING, MoveState.ORPHANED), move.state
            marked = ((config.task.metadata or {}).get(PUSH_CHANNEL_URI) or {}).get(
                "orphanedChannels", []
            )
            orphan = any(c["configId"] == config.config_id for c in marked)
            assert orphan == (move.state == MoveState.ORPHANED), (move.state, marked)

    @invariant()
    def the_strict_receiver_accepts_every_delivery_or_the_rebind_shows_why(self) -> None:
        if not hasattr(self, "receiver"):
            return
        for answer in self.receiver.answers:
            assert answer.kind != "invalid", answer
            if answer.kind != "channel":
                continue
            # A documented refusal: the receiver was never told of the channel because the
            # notice that would have told it was not delivered (dead, withdrawn by an
            # operator's "move now", superseded by a cutover) or the task was orphaned and
            # its orphaned notice never arrived. The rebind shows it.
            untold = ChannelMove.objects.filter(task_id=answer.task_id).filter(
                ~Q(notice__state=DeliveryState.DELIVERED) | Q(notice=None)
            )
            assert untold.exists(), answer

    @invariant()
    def counts_agree_with_a_recount_and_with_the_console(self) -> None:
        if not hasattr(self, "agent_row"):
            return
        for rebind in Rebind.objects.filter(agent=self.agent_row):
            moves = ChannelMove.objects.filter(rebind=rebind).select_related("task", "config")
            recount = sum(
                1
                for m in moves
                if m.config.deleted_at is None
                and (
                    m.state == MoveState.NOTICE_PENDING
                    or m.state == MoveState.FINISHING_ON_OLD
                    and m.task.state not in TERMINAL_VALUES
                )
            )
            counts = rebind_counts(rebind)
            assert counts["onOldVersionTotal"] == recount, (counts, recount)
            drain = ChannelMove.objects.filter(rebind=rebind).keeping_drain_open().count()
            console = rebind_console.on_old_moves(rebind).count()
            listed = len(rebind_stragglers(rebind, limit=10_000))
            assert drain == console == listed == recount, (drain, console, listed, recount)
            by_state = dict.fromkeys(MoveState.values, 0)
            for m in moves:
                by_state[m.state] += 1
            assert counts["moved"] == by_state[MoveState.MOVED]
            assert counts["orphaned"] == by_state[MoveState.ORPHANED]
            if rebind.state == RebindState.COMPLETED:
                assert recount == 0, f"completed with {recount} on the old version"

    @invariant()
    def every_open_notice_is_usable(self) -> None:
        if not hasattr(self, "receiver"):
            return
        for body in Delivery.objects.filter(
            binding__config__task__agent=self.agent_row,
            kind="notice",
            state__in=[DeliveryState.PENDING, DeliveryState.SENDING],
        ).values_list("body", flat=True):
            entry = json.loads(body)["statusUpdate"]["metadata"][PUSH_CHANNEL_URI]
            assert entry.get("jwksUrl") == self.receiver.jwks_url, entry
            if entry["notice"] == "channel-changed":
                assert entry["newChannel"]["keyIds"], entry


@pytest.fixture
def model_settings(settings):
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    settings.A2A_WEBHOOK_RETRY_SCHEDULE = ["0", "0"]
    settings.A2A_WEBHOOK_AUTH_RETRY_SCHEDULE = ["0"]
    settings.A2A_WEBHOOK_TIMEOUT_SECONDS = 2
    settings.A2A_WEBHOOK_PUMP_LINGER_SECONDS = 0
    settings.A2A_WEBHOOK_PUMP_SECONDS = 5
    settings.A2A_WEBHOOK_ENDPOINT_FAILING_AFTER = 10_000
    return settings


def test_any_sequence_of_rebind_operations_keeps_the_invariants(model_settings):
    RebindModel.TestCase.settings = settings(
        max_examples=EXAMPLES,
        stateful_step_count=STEPS,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        # `make test` replays the same examples each run; `make test-deep` draws new ones.
        derandomize=os.environ.get("A2A_MODEL_RANDOM") is None,
    )
    RebindModel.TestCase().runTest()


def test_the_model_runs_real_steps(model_settings):
    """The model is not vacuous: one fixed walk opens tasks over both bindings, drains, and
    the strict receiver accepts the notice and the moved task's next event."""
    machine = RebindModel()
    try:
        machine.agent()
        task = machine.open_task(binding=protocol_push.REST, prefix=PREFIXES[0])
        machine.transition(task=task, state=TaskState.WORKING)
        machine.deliver()
        assert command(
            "start",
            machine.agent_row.slug,
            "--rotate-key",
            "--move-prefix",
            machine.receiver.origin + PREFIXES[0],
            machine.receiver.origin + PREFIXES[1],
        )
        machine.deliver()
        machine.transition(task=task, state=TaskState.INPUT_REQUIRED)
        machine.deliver()
        rebind = Rebind.objects.get(agent=machine.agent_row)
        command("advance", str(rebind.pk))
        kinds = [(a.version, a.kind) for a in machine.receiver.answers]
        assert kinds == [
            ("cfg.v1", "accepted"),  # the snapshot
            ("cfg.v1", "accepted"),  # WORKING
            ("cfg.v1", "accepted"),  # the notice
            ("cfg.v2", "accepted"),  # INPUT_REQUIRED, on the new channel
        ], kinds
        assert Rebind.objects.get(pk=rebind.pk).state == RebindState.COMPLETED
        assert Task.objects.get(pk=task).task_state == TaskState.INPUT_REQUIRED
        for check in (
            machine.no_version_activated_after_it_was_retired,
            machine.nothing_sent_on_a_version_it_was_not_written_for,
            machine.every_task_in_flight_is_on_one_channel_or_orphaned,
            machine.the_strict_receiver_accepts_every_delivery_or_the_rebind_shows_why,
            machine.counts_agree_with_a_recount_and_with_the_console,
        ):
            check()
    finally:
        machine.teardown()
