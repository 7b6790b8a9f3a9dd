"""Which protocol route a request path is, if any (everything else goes to Django).

Un-prefixed routes are tried before `/{tenant}/…`, and reserved slugs are never tenants, so
`/tasks/x` is always GetTask of the default agent (digest §5, §13 item 20).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from a2a_platform.protocol.operations import UNARY
from a2a_platform.protocol.streams import OPEN
from agents.models import RESERVED_SLUGS

# Every A2A method by name: the unary operations and the streaming ones (each opens a
# TaskStream the bindings frame as SSE).
METHODS = UNARY | OPEN
STREAMING_OPERATIONS = frozenset(OPEN)

_TASK = r"(?P<id>[^/:]+)"
_CFG = r"(?P<config_id>[^/:]+)"

# (methods, pattern of the path after the tenant, route name)
_V1_ROUTES: list[tuple[frozenset[str], re.Pattern, str]] = [
    (frozenset({"GET"}), re.compile(r"/\.well-known/agent-card\.json"), "card"),
    (frozenset({"GET"}), re.compile(r"/\.well-known/jwks\.json"), "jwks"),
    (frozenset({"POST"}), re.compile(r"/?"), "jsonrpc"),
    (frozenset({"POST"}), re.compile(r"/message:send"), "SendMessage"),
    (frozenset({"POST"}), re.compile(r"/message:stream"), "SendStreamingMessage"),
    (frozenset({"GET"}), re.compile(r"/tasks"), "ListTasks"),
    (frozenset({"GET"}), re.compile(rf"/tasks/{_TASK}"), "GetTask"),
    (frozenset({"POST"}), re.compile(rf"/tasks/{_TASK}:cancel"), "CancelTask"),
    (frozenset({"GET", "POST"}), re.compile(rf"/tasks/{_TASK}:subscribe"), "SubscribeToTask"),
    (
        frozenset({"POST"}),
        re.compile(rf"/tasks/{_TASK}/pushNotificationConfigs"),
        "CreateTaskPushNotificationConfig",
    ),
    (
        frozenset({"GET"}),
        re.compile(rf"/tasks/{_TASK}/pushNotificationConfigs"),
        "ListTaskPushNotificationConfigs",
    ),
    (
        frozenset({"GET"}),
        re.compile(rf"/tasks/{_TASK}/pushNotificationConfigs/{_CFG}"),
        "GetTaskPushNotificationConfig",
    ),
    (
        frozenset({"DELETE"}),
        re.compile(rf"/tasks/{_TASK}/pushNotificationConfigs/{_CFG}"),
        "DeleteTaskPushNotificationConfig",
    ),
    (frozenset({"GET"}), re.compile(r"/extendedAgentCard"), "GetExtendedAgentCard"),
]

# v0.3 lives under `<agent url>/v0.3`: JSON-RPC at that URL, REST below it at `/v1/…`.
_V03_ROUTES: list[tuple[frozenset[str], re.Pattern, str]] = [
    (frozenset({"POST"}), re.compile(r"/v0\.3/?"), "jsonrpc"),
    (frozenset({"GET"}), re.compile(r"/v0\.3/\.well-known/agent-card\.json"), "card"),
    (frozenset({"POST"}), re.compile(r"/v0\.3/v1/message:send"), "SendMessage"),
    (frozenset({"POST"}), re.compile(r"/v0\.3/v1/message:stream"), "SendStreamingMessage"),
    (frozenset({"GET"}), re.compile(rf"/v0\.3/v1/tasks/{_TASK}"), "GetTask"),
    (frozenset({"POST"}), re.compile(rf"/v0\.3/v1/tasks/{_TASK}:cancel"), "CancelTask"),
    (
        frozenset({"GET", "POST"}),
        re.compile(rf"/v0\.3/v1/tasks/{_TASK}:subscribe"),
        "SubscribeToTask",
    ),
    (
        frozenset({"POST"}),
        re.compile(rf"/v0\.3/v1/tasks/{_TASK}/pushNotificationConfigs"),
        "CreateTaskPushNotificationConfig",
    ),
    (
        frozenset({"GET"}),
        re.compile(rf"/v0\.3/v1/tasks/{_TASK}/pushNotificationConfigs"),
        "ListTaskPushNotificationConfigs",
    ),
    (
        frozenset({"GET"}),
        re.compile(rf"/v0\.3/v1/tasks/{_TASK}/pushNotificationConfigs/{_CFG}"),
        "GetTaskPushNotificationConfig",
    ),
    (
        frozenset({"DELETE"}),
        re.compile(rf"/v0\.3/v1/tasks/{_TASK}/pushNotificationConfigs/{_CFG}"),
        "DeleteTaskPushNotificationConfig",
    ),
    (frozenset({"GET"}), re.compile(r"/v0\.3/v1/card"), "GetExtendedAgentCard"),
]

_TENANT = re.compile(r"^/(?P<tenant>[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?)(?P<rest>/.*)?$")


@dataclass(frozen=True)
class Route:
    name: str
    tenant: str | None
    legacy: bool  # a v0.3 URL
    params: dict[str, str] = field(default_factory=dict)
    method_allowed: bool = True
    allowed: frozenset[str] = frozenset()  # the methods the path takes, when this one is not
    # The path's pattern, parameters named (`/{tenant}/tasks/{id}`): the metrics' http_route.
    template: str = ""


def _template(pattern: re.Pattern) -> str:
    path = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", pattern.pattern)
    return path.replace("\\.", ".").replace("/?", "/") or "/"


_TEMPLATES = {p: _template(p) for _, p, _ in (*_V1_ROUTES, *_V03_ROUTES)}


def _match(method: str, rest: str, tenant: str | None) -> Route | None:
    wrong_method = None
    for legacy, table in ((False, _V1_ROUTES), (True, _V03_ROUTES)):
        for methods, pattern, name in table:
            m = pattern.fullmatch(rest)
            if m is None:
                continue
            template = ("/{tenant}" if tenant else "") + _TEMPLATES[pattern]
            if method in methods:
                return Route(name, tenant, legacy, m.groupdict(), template=template)
            wrong_method = wrong_method or Route(
                name, tenant, legacy, m.groupdict(), False, methods, template
            )
    return wrong_method


def resolve(method: str, path: str) -> Route | None:
    route = None
    if path != "/" or method == "POST":
        route = _match(method, path, None)
    if path == "/" and method == "POST":
        return route
    if route is not None and route.method_allowed:
        return route
    m = _TENANT.match(path)
    if m and m.group("tenant") not in RESERVED_SLUGS:
        tenant_route = _match(method, m.group("rest") or "", m.group("tenant"))
        if tenant_route is not None and (tenant_route.method_allowed or route is None):
            return tenant_route
    return route
