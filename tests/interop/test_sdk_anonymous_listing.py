"""The official a2a-sdk client's ListTasks against a public agent (issue 18): refused by
default without a contextId (the wire tests: tests/integration/protocol/
test_interop_switches.py), it works, paging included, on an agent whose
`anonymous_list_tasks` lists the anonymous callers' tasks."""

from __future__ import annotations

import pytest
from a2a.types import a2a_pb2

from agents.models import AnonymousListing
from tests.factories import AgentFactory
from tests.interop.test_sdk_client import BINDINGS, connect, run, send_task


@pytest.mark.parametrize("binding", BINDINGS)
def test_the_sdk_client_lists_and_pages_an_anonymous_agents_tasks(live_platform, binding):
    agent = AgentFactory(executor="scripted", anonymous_list_tasks=AnonymousListing.ANONYMOUS_TASKS)
    url = live_platform.agent_url(agent)

    async def scenario():
        async with connect(url, binding) as client:
            first = await send_task(client, "one")
            second = await send_task(client, "two")
            page = await client.list_tasks(a2a_pb2.ListTasksRequest(page_size=1))
            assert page.total_size == 2
            assert [t.id for t in page.tasks] == [second.id]
            assert page.next_page_token
            rest = await client.list_tasks(
                a2a_pb2.ListTasksRequest(page_size=1, page_token=page.next_page_token)
            )
            assert [t.id for t in rest.tasks] == [first.id]
            assert rest.next_page_token == ""

    run(scenario)
