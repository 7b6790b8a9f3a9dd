"""Shared fixtures: agents, and real worker processes that are always stopped."""

from __future__ import annotations

import pytest

from tests import processes
from tests.factories import AgentFactory


@pytest.fixture
def agent(db):
    return AgentFactory(executor="echo")


@pytest.fixture
def scripted_agent(db):
    return AgentFactory(executor="scripted")


class Procs:
    """Starts real processes with `worker(...)` / `beat(...)`, logs in `log_dir`; `stop_all`
    stops them and prints each log's tail (pytest shows it only when a test failed)."""

    def __init__(self, log_dir) -> None:
        self.log_dir = log_dir
        self.started: list[processes.Proc] = []

    def worker(self, **kw):
        p = processes.start_worker(self.log_dir, **kw)
        self.started.append(p)
        return p

    def beat(self, **kw):
        p = processes.start_beat(self.log_dir, **kw)
        self.started.append(p)
        return p

    def adopt(self, proc: processes.Proc) -> processes.Proc:
        """Stop `proc` with the others (one this holder did not start, e.g. a receiver's)."""
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        for p in reversed(self.started):
            p.stop()
            print(f"----- {p.name} log (tail) -----\n{p.log()[-6000:]}")  # noqa: T201
        if self.started:
            processes.forget_broker_state()


@pytest.fixture
def procs(tmp_path):
    """Start real processes with `procs.worker(...)` / `procs.beat(...)`; all stopped at the end."""
    holder = Procs(tmp_path)
    yield holder
    holder.stop_all()


@pytest.fixture(scope="module")
def module_procs(django_db_setup, tmp_path_factory):
    """`procs` for a whole module: a worker started once serves every test of it (each test's
    data is committed and then flushed, and the worker keeps no state of it that matters)."""
    holder = Procs(tmp_path_factory.mktemp("procs"))
    yield holder
    holder.stop_all()


@pytest.fixture
def loopback_receivers(settings):
    """This test process registers webhooks to receiver processes on loopback, which the
    SSRF policy refuses unless allowlisted (tests/webhook_checks.configure)."""
    from tests.webhook_checks import configure

    configure(settings)


@pytest.fixture
def receivers(tmp_path):
    """Start webhook receiver processes (tests.webhook_receiver) with `receivers.start(name)`;
    all stopped at the end."""
    from tests.webhook_receiver import ReceiverProcess

    class Receivers:
        def __init__(self) -> None:
            self.started: list[ReceiverProcess] = []

        def start(self, name: str = "receiver", **behaviour) -> ReceiverProcess:
            receiver = ReceiverProcess(tmp_path, name=name)
            if behaviour:
                receiver.behave(**behaviour)
            self.started.append(receiver)
            return receiver.start()

    holder = Receivers()
    yield holder
    for receiver in holder.started:
        receiver.stop()
        records = [(r.n, r.header("x-a2a-task-seq"), r.answer) for r in receiver.records()]
        print(f"----- {receiver.name} records -----\n{records}")  # noqa: T201
