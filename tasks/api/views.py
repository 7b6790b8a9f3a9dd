"""Worker REST API for external agent backends (per-agent worker token).

Same lifecycle services, same validation as the built-in executors; each view parses, calls
one service and renders. Errors are mapped in tasks/api/errors.py.
"""

from __future__ import annotations

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from tasks import selectors, services, wire
from tasks.api.auth import WorkerTokenAuthentication
from tasks.api.serializers import (
    ArtifactSerializer,
    FinishSerializer,
    MessageSerializer,
    TransitionSerializer,
    check_storable,
)
from tasks.dispatch import dispatch_claim_next, dispatch_finish, dispatch_renew
from tasks.errors import DispatchLeaseLost, InvalidPayload, TaskNotFound
from tasks.models import Task
from tasks.states import TaskState


def _task_snapshot(task: Task) -> dict:
    return wire.task_json(
        task,
        history=selectors.task_history(task, None),
        artifacts=selectors.task_artifacts(task),
    )


class WorkerView(APIView):
    authentication_classes = [WorkerTokenAuthentication]

    def agent_task(self, task_id) -> Task:
        task = selectors.task_for_agent(agent_id=self.request.user.agent.pk, task_id=task_id)
        if task is None:
            raise TaskNotFound(task_id)
        return task

    def parsed(self, serializer_class):
        serializer = serializer_class(data=self.request.data)
        serializer.is_valid(raise_exception=True)
        check_storable(serializer.validated_data)
        return serializer.validated_data


class TaskListView(WorkerView):
    def get(self, request):
        state = request.query_params.get("state", TaskState.SUBMITTED.value)
        if state not in {s.value for s in TaskState}:
            raise InvalidPayload("state", "unknown task state")
        tasks = selectors.tasks_in_state(agent_id=request.user.agent.pk, state=state)
        return Response({"tasks": [wire.task_json(t) for t in tasks]})


class ClaimView(WorkerView):
    def post(self, request):
        claim = dispatch_claim_next(agent=request.user.agent, worker=request.user.claimant)
        if claim is None:
            return Response(status=status.HTTP_204_NO_CONTENT)
        task = selectors.task_for_agent(agent_id=request.user.agent.pk, task_id=claim.task_id)
        return Response(
            {
                "dispatchId": claim.dispatch_id,
                "leaseExpiresAt": wire.timestamp_json(claim.lease_expires_at),
                "progress": claim.progress,
                "task": _task_snapshot(task),
            }
        )


class DispatchRenewView(WorkerView):
    def post(self, request, dispatch_id: int):
        if not dispatch_renew(dispatch_ids=[dispatch_id], worker=request.user.claimant):
            raise DispatchLeaseLost(dispatch_id)
        return Response({"dispatchId": dispatch_id, "renewed": True})


class DispatchFinishView(WorkerView):
    def post(self, request, dispatch_id: int):
        data = self.parsed(FinishSerializer)
        if not dispatch_finish(
            dispatch_id=dispatch_id,
            worker=request.user.claimant,
            run_again_after=data.get("runAgainAfter"),
        ):
            raise DispatchLeaseLost(dispatch_id)
        return Response({"dispatchId": dispatch_id, "finished": True})


class TransitionView(WorkerView):
    def post(self, request, task_id):
        task = self.agent_task(task_id)
        data = self.parsed(TransitionSerializer)
        try:
            task = services.task_transition(
                task_id=task.pk, to_state=data["state"], message=data.get("message")
            )
        except InvalidPayload as exc:
            # The service names the status message as it appears in the event; the caller
            # sent it as `message`.
            if exc.field.startswith("status.message"):
                field = "message" + exc.field.removeprefix("status.message")
                raise InvalidPayload(field, exc.description) from None
            raise
        return Response(wire.task_json(task))


class ArtifactView(WorkerView):
    def post(self, request, task_id):
        task = self.agent_task(task_id)
        data = self.parsed(ArtifactSerializer)
        task = services.task_add_artifact(
            task_id=task.pk,
            artifact=data["artifact"],
            append=data["append"],
            last_chunk=data["lastChunk"],
        )
        return Response(wire.task_json(task, artifacts=selectors.task_artifacts(task)))


class MessageView(WorkerView):
    def post(self, request, task_id):
        task = self.agent_task(task_id)
        data = self.parsed(MessageSerializer)
        task = services.task_add_agent_message(task_id=task.pk, message=data["message"])
        return Response(wire.task_json(task, history=selectors.task_history(task, None)))
