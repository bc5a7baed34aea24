"""Authentication and authorization of every call, as a gRPC server interceptor.

With `auth.enabled`, each call to the broker's client services is first authenticated
from its metadata alone (signature.py), before its request is even parsed: a call nobody
signed, or signed wrongly, costs one HMAC at most and is refused. Then, with the request in
hand, its user's policy must grant what the call needs (v2_grants.py, v1_grants.py; acl.py
decides). Refusals say what was refused and never echo a secret:

- apache.rocketmq.v2 answers in the reply's status, as RocketMQ 5's proxy does:
  UNAUTHORIZED for a failed signature, FORBIDDEN naming the action and the resource.
- capstan.v1 answers the gRPC status UNAUTHENTICATED or PERMISSION_DENIED.

Health checks and reflection stay open (probes and tools call them unsigned); the
replication services belong to the cluster's own processes, which sign with the cluster's
identity (`capstan.cluster` and the cluster's secret, peers.py) and may call anything; no
user, super or not, may call replication. A method the tables do not know is refused to
every user but a super user. Each refusal is counted in
`capstan_auth_failures_total{reason}` and logged at most once a minute per reason, with the
count of the rest.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import grpc

from capstan.broker.edge.access import v1_grants, v2_grants
from capstan.broker.store.user_table import UserTable
from capstan.common.grpc_guard import Malformed
from capstan.common.log_limit import LimitedLog, Schedule
from capstan.common.security_settings import AuthSettings
from capstan.security.acl import Grant, User, UserType, Verdict, decide
from capstan.security.peers import ForgedForwarding, forwarded_source, source_address
from capstan.security.signature import AuthenticationError, Credentials, Failure, verify

log = logging.getLogger(__name__)

LOG_INTERVAL_S = 60.0
OPEN_SERVICES = frozenset({"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"})
V2 = v2_grants.SERVICE
FORBIDDEN = "forbidden"

Behaviour = Callable[[Any, grpc.aio.ServicerContext], Any]
_Checked = tuple[User, grpc.RpcMethodHandler, grpc.RpcMethodHandler]
CHECKED_HANDLERS = 4096
"""At most this many checking handlers are kept (then they are made again as calls come)."""
DECIDED_PER_HANDLER = 256
"""At most this many verdicts are kept per checking handler."""


class AccessGuard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(
        self,
        settings: AuthSettings,
        cluster: str,
        count: Callable[[str], None],
        schedule: Schedule | None = None,
    ) -> None:
        """`cluster` names the Cluster resource of admin calls (the broker group);
        `count(reason)` counts a refusal."""
        self._settings = settings
        self._cluster = cluster
        self._count = count
        extra = {} if schedule is None else {"schedule": schedule}
        self._log = LimitedLog(log, LOG_INTERVAL_S, **extra)
        self._users: UserTable | None = None
        self._checked: dict[tuple[str, int, str | None], _Checked] = {}
        """The checking handler made for a method, a user (as the table holds it now: a
        changed user is a new object) and a forwarded source, made once and reused."""
        self._cluster_principal: User | None = None
        """The cluster's own processes: a super user no table holds, and the only caller
        of the replication services."""

    def bind(self, users: UserTable, cluster: Credentials | None) -> None:
        """Check calls against `users` and the cluster's identity from now on (before, the
        broker is starting and its late-bound services refuse every call anyway)."""
        self._users = users
        if cluster is not None:
            self._cluster_principal = User(cluster.access_key, cluster.secret_key, UserType.SUPER)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method: str = details.method.lstrip("/")
        service = method.partition("/")[0]
        if handler is None or not self._settings.enabled or self._users is None:
            return handler
        if service in OPEN_SERVICES:
            return handler
        try:
            user = self._authenticate(details.invocation_metadata or ())
        except AuthenticationError as exc:
            self._refused(exc.failure.value, method, exc.detail)
            return _refusing(method, handler, exc.detail)
        if user is self._cluster_principal:
            return handler
        if service in v1_grants.CLUSTER_ONLY:
            detail = f"{method} is for the cluster's own processes, not for {user.name}"
            self._refused(FORBIDDEN, method, detail)
            return _refusing(method, handler, detail, denied=True)
        if user.is_super:  # holds every grant, from anywhere: nothing left to check
            return handler
        try:
            source = self._forwarded_source(details.invocation_metadata or ())
        except ForgedForwarding as exc:
            self._refused(Failure.FORGED_FORWARDING.value, method, str(exc))
            return _refusing(method, handler, str(exc))
        key = (method, id(user), source)
        cached = self._checked.get(key)
        if cached is not None and cached[0] is user and cached[1] is handler:
            return cached[2]
        checked = self._authorizing(method, handler, user, source)
        if len(self._checked) >= CHECKED_HANDLERS:
            self._checked.clear()
        self._checked[key] = (user, handler, checked)
        return checked

    def _forwarded_source(self, metadata: Sequence[tuple[str, str | bytes]]) -> str | None:
        """The client's address when a peer passed its call on (peers.py), else None."""
        cluster = self._cluster_principal
        if cluster is None:
            return None
        return forwarded_source(metadata, cluster.secret_key)

    def _authenticate(self, metadata: Sequence[tuple[str, str | bytes]]) -> User:
        users = self._users
        assert users is not None

        cluster = self._cluster_principal

        def secret_of(access_key: str) -> str | None:
            if cluster is not None and access_key == cluster.name:
                return cluster.secret_key
            user = users.get(access_key)
            if user is not None and not user.enabled:
                raise AuthenticationError(
                    Failure.DISABLED_USER, f"the user {access_key!r} is disabled"
                )
            return None if user is None else user.secret_key

        now = datetime.now(UTC)
        name = verify(metadata, secret_of, now, self._settings.max_clock_skew_s)
        if cluster is not None and name == cluster.name:
            return cluster
        user = users.get(name)
        if user is None:  # deleted between the two lookups
            raise AuthenticationError(Failure.UNKNOWN_USER, f"no user has the access key {name!r}")
        return user

    def _refused(self, reason: str, method: str, detail: str) -> None:
        self._count(reason)
        self._log.note(
            reason,
            lambda: log.warning("refused a call to %s (%s): %s", method, reason, detail),
            f"calls refused as {reason}",
        )

    def _verdict(
        self,
        user: User,
        method: str,
        needs: list[Grant],
        source: str | None,
        decided: dict[tuple[tuple[Grant, ...], str | None], Verdict],
    ) -> Verdict:
        """`decided`: the verdicts reached for this user (it never changes: a changed user
        is another object) by what was needed and from where."""
        key = (tuple(needs), source)
        verdict = decided.get(key)
        if verdict is None:
            verdict = decide(user, needs, source)
            if len(decided) >= DECIDED_PER_HANDLER:
                decided.clear()
            decided[key] = verdict
        if not verdict.allowed:
            what = str(verdict.refused) if verdict.refused else f"the method {method}"
            self._refused(FORBIDDEN, method, f"{user.name}: {what} ({verdict.reason})")
        return verdict

    def _authorizing(
        self, method: str, handler: grpc.RpcMethodHandler, user: User, forwarded_for: str | None
    ) -> grpc.RpcMethodHandler:
        """`forwarded_for`: the client's address, vouched for by the peer passing the call on;
        None: the caller's own."""

        def source_of(context: grpc.aio.ServicerContext) -> str | None:
            return forwarded_for or source_address(context.peer())

        service, _, name = method.partition("/")
        v2 = service == V2
        decided: dict[tuple[tuple[Grant, ...], str | None], Verdict] = {}
        table_needs = v2_grants.NEEDS.get(name) if v2 else v1_grants.NEEDS.get(method)

        def needs_of(request: Any) -> list[Grant] | None:
            """None: a method no table knows, for super users alone."""
            if table_needs is None:
                return None
            if v2:
                return table_needs(request)  # type: ignore[call-arg]
            return table_needs(request, self._cluster)  # type: ignore[call-arg]

        async def check(request: Any, context: grpc.aio.ServicerContext) -> str | None:
            """Why the call is refused, or None to let it through."""
            if isinstance(request, Malformed):
                return None  # the request guard refuses it
            needs = needs_of(request)
            if needs is None:
                return None if user.is_super else f"{method} is for super users"
            verdict = self._verdict(user, method, needs, source_of(context), decided)
            return None if verdict.allowed else _denial(user, verdict)

        def chunk_check(item: Any, context: grpc.aio.ServicerContext) -> str | None:
            if isinstance(item, Malformed):
                return None
            needs = v2_grants.settings_needs(item) if v2 else v1_grants.chunk_needs(method, item)
            if not needs:
                return None
            verdict = self._verdict(user, method, needs, source_of(context), decided)
            return None if verdict.allowed else _denial(user, verdict)

        if handler.unary_unary is not None or handler.unary_stream is not None:
            return _with_check(method, handler, check)
        return _with_stream_check(method, handler, chunk_check)


def _denial(user: User, verdict: Verdict) -> str:
    return f"{user.name} may not {verdict.refused}: {verdict.reason}"


def _is_v2(method: str) -> bool:
    return method.partition("/")[0] == V2


def _refusal_reply(method: str, code_v2: int, detail: str) -> Any:
    return v2_grants.refusal(method.partition("/")[2], code_v2, detail)


async def _abort(context: grpc.aio.ServicerContext, denied: bool, detail: str) -> None:
    code = grpc.StatusCode.PERMISSION_DENIED if denied else grpc.StatusCode.UNAUTHENTICATED
    await context.abort(code, detail)


def _codecs(handler: grpc.RpcMethodHandler) -> dict[str, Any]:
    return {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }


def _ignore(_: bytes) -> None:
    """The deserializer of a refused call: its request is never parsed."""
    return None


def _refusing(
    method: str, handler: grpc.RpcMethodHandler, detail: str, denied: bool = False
) -> grpc.RpcMethodHandler:
    """A handler refusing a call without reading its request: unauthenticated, or (with
    `denied`) one its caller may not make whatever it asks."""
    codecs = {"request_deserializer": _ignore, "response_serializer": handler.response_serializer}
    v2 = _is_v2(method)
    v2_code = v2_grants.FORBIDDEN if denied else v2_grants.UNAUTHORIZED

    async def once(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if v2:
            return _refusal_reply(method, v2_code, detail)
        await _abort(context, denied, detail)

    async def streamed(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if v2:
            yield _refusal_reply(method, v2_code, detail)
            return
        await _abort(context, denied, detail)

    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(once, **codecs)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(streamed, **codecs)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(once, **codecs)
    return grpc.stream_stream_rpc_method_handler(streamed, **codecs)


Check = Callable[[Any, grpc.aio.ServicerContext], Awaitable["str | None"]]


def _with_check(method: str, handler: grpc.RpcMethodHandler, check: Check) -> grpc.RpcMethodHandler:
    """`handler` (one request), called only when `check` lets its request through."""
    codecs = _codecs(handler)
    v2 = _is_v2(method)
    if handler.unary_unary is not None:
        inner = handler.unary_unary

        async def once(request: Any, context: grpc.aio.ServicerContext) -> Any:
            denial = await check(request, context)
            if denial is None:
                return await inner(request, context)
            if v2:
                return _refusal_reply(method, v2_grants.FORBIDDEN, denial)
            await _abort(context, True, denial)

        return grpc.unary_unary_rpc_method_handler(once, **codecs)
    streaming = handler.unary_stream
    if inspect.iscoroutinefunction(streaming):

        async def written(request: Any, context: grpc.aio.ServicerContext) -> None:
            denial = await check(request, context)
            if denial is None:
                await streaming(request, context)
            elif v2:
                await context.write(_refusal_reply(method, v2_grants.FORBIDDEN, denial))
            else:
                await _abort(context, True, denial)

        return grpc.unary_stream_rpc_method_handler(written, **codecs)

    async def streamed(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        denial = await check(request, context)
        if denial is None:
            async for reply in streaming(request, context):
                yield reply
        elif v2:
            yield _refusal_reply(method, v2_grants.FORBIDDEN, denial)
        else:
            await _abort(context, True, denial)

    return grpc.unary_stream_rpc_method_handler(streamed, **codecs)


ChunkCheck = Callable[[Any, grpc.aio.ServicerContext], "str | None"]


class _CheckedStream:
    """A request stream whose messages are each checked: at the first refused one it ends
    (v2: the handler then sees the client finish, and the guard answers FORBIDDEN) or aborts
    the call (v1)."""

    def __init__(
        self, requests: Any, check: ChunkCheck, context: grpc.aio.ServicerContext, v2: bool
    ) -> None:
        self._requests = requests
        self._check = check
        self._context = context
        self._v2 = v2
        self.denial: str | None = None

    def __aiter__(self) -> _CheckedStream:
        return self

    async def __anext__(self) -> Any:
        if self.denial is not None:
            raise StopAsyncIteration
        item = await anext(self._requests)
        denial = self._check(item, self._context)
        if denial is None:
            return item
        self.denial = denial
        if not self._v2:
            await self._context.abort(grpc.StatusCode.PERMISSION_DENIED, denial)
        raise StopAsyncIteration


def _with_stream_check(
    method: str, handler: grpc.RpcMethodHandler, check: ChunkCheck
) -> grpc.RpcMethodHandler:
    """`handler` (a request stream) fed only the messages `check` lets through."""
    codecs = _codecs(handler)
    v2 = _is_v2(method)
    if handler.stream_unary is not None:
        inner = handler.stream_unary

        async def once(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            return await inner(_CheckedStream(requests, check, context, v2), context)

        return grpc.stream_unary_rpc_method_handler(once, **codecs)
    streaming = handler.stream_stream
    if inspect.iscoroutinefunction(streaming):

        async def written(requests: Any, context: grpc.aio.ServicerContext) -> None:
            checked = _CheckedStream(requests, check, context, v2)
            await streaming(checked, context)
            if checked.denial is not None and v2:
                await context.write(_refusal_reply(method, v2_grants.FORBIDDEN, checked.denial))

        return grpc.stream_stream_rpc_method_handler(written, **codecs)

    async def streamed(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        checked = _CheckedStream(requests, check, context, v2)
        async for reply in streaming(checked, context):
            yield reply
        if checked.denial is not None and v2:
            yield _refusal_reply(method, v2_grants.FORBIDDEN, checked.denial)

    return grpc.stream_stream_rpc_method_handler(streamed, **codecs)
