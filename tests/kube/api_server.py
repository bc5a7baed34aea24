"""A Kubernetes API server for tests: kmock's emulator with the write rules clients rely on.

kmock 0.8's `KubernetesEmulator` keeps objects in memory and serves discovery, get, list and
watch, but its writes lack what a real API server guarantees and controllers depend on
(research/kmock_eval.md): no server-set metadata, no optimistic concurrency, no replace.
`ApiServer` takes every write over and applies the API server's rules, for any resource it
declares (kmock's bundled built-ins; declare a CRD's resource in `emulator.resources`):

- **server-owned metadata**: `uid` and `creationTimestamp` on create, kept by every later
  write; `resourceVersion` from one counter for the whole server (like etcd's revision),
  bumped by every write; the namespace from the URL; `generateName`.
- **optimistic concurrency**: a replace or patch whose result carries a resourceVersion
  other than the stored one is refused with 409 Conflict (a replace without one is
  unconditional, as for built-in resources), and so is a delete whose preconditions fail.
- **existence**: a create of a live name is 409 AlreadyExists; a replace, patch, delete or
  get of a missing object is 404 NotFound, and so is any write to an undeclared resource.
- **patches**: JSON patch (RFC 6902; a failed `test` is 422 Invalid) and merge patch
  (RFC 7386). A strategic merge patch is applied as a merge patch, so lists are replaced,
  not merged; server-side apply is 415.
- **subresources**: a write to `.../status` changes only `status`; a write to the object
  leaves `status` alone when the resource declares a status subresource.
- **deletion**: an object with finalizers gets a `deletionTimestamp` and goes when a write
  removes its last finalizer.
- **MicroTime**: Lease `acquireTime`/`renewTime` and Event `eventTime` need exactly six
  fractional digits, as apimachinery's parser does (400 otherwise).

Refusals are `Status` objects with the real reasons and messages. They are answers, not
emulator failures, so they stay out of kmock's `errors`; `RunningApiServer.stop()` raises
if anything landed there. Reads, lists and watches remain kmock's, with their limits (a
watch replays every object and ignores resourceVersion and selectors; lists have no kind).
A kmock reaction that answers a write first (fault injection, e.g.
`emulator[kmock.resource("v1/configmaps")] << 500`) keeps it from landing, as a failed
request would.

`ApiServer` uses kmock's private `_objects`, `_lock`, `_buses` and `_payloads`, and redoes
its dispatch with a membership test that does not rescan the request history: kmock is
pinned to 0.8.
`serve_in_thread()` runs it on 127.0.0.1 in a thread of its own, for synchronous clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime
import re
import secrets
import string
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import jsonpatch
import kmock
from kubernetes import client

Object = dict[str, Any]
Key = tuple[kmock.resource, str | None, str]
Write = Callable[[kmock.Request], tuple[int, str | None, Object]]
"""Checks and applies one write under the lock: the HTTP status, the watch event to publish
(None when nothing changed) and the object."""

MICRO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)")
MICRO_TIME_FIELDS = {
    ("coordination.k8s.io", "leases"): (("spec", "acquireTime"), ("spec", "renewTime")),
    ("events.k8s.io", "events"): (("eventTime",),),
}
"""MicroTime fields by (group, plural); apimachinery parses them with the fixed layout
2006-01-02T15:04:05.000000Z07:00."""

JSON_PATCH = "application/json-patch+json"
MERGE_PATCHES = ("application/merge-patch+json", "application/strategic-merge-patch+json")
STALE = "the object has been modified; please apply your changes to the latest version"
NO_RESOURCE = "the server could not find the requested resource"


class Refusal(Exception):
    """A request the API server turns down, answered with a `Status`."""

    def __init__(self, code: int, reason: str, message: str, details: Object | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    @classmethod
    def about(cls, key: Key, code: int, reason: str, message: str) -> Refusal:
        resource, _, name = key
        details = {"name": name, "group": resource.group, "kind": resource.plural}
        return cls(
            code, reason, message.replace("{what}", f'{_qualified(resource)} "{name}"'), details
        )

    @classmethod
    def conflict(cls, key: Key, why: str) -> Refusal:
        return cls.about(key, 409, "Conflict", f"Operation cannot be fulfilled on {{what}}: {why}")

    def response(self) -> kmock.Response:
        status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
        status |= {"message": self.message, "reason": self.reason, "code": self.code}
        return kmock.Response(status=self.code, payload=status | {"details": self.details or {}})


def _qualified(resource: kmock.resource) -> str:
    return f"{resource.plural}.{resource.group}" if resource.group else str(resource.plural)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _header(request: kmock.Request, name: str) -> str:
    return next((v for k, v in request.headers.items() if k.lower() == name.lower()), "")


def _with_status(obj: Object, source: Object) -> Object:
    """`obj` with the status of `source` (or none, if `source` has none)."""
    kept = {key: value for key, value in obj.items() if key != "status"}
    return kept | ({"status": source["status"]} if "status" in source else {})


def sees(view: kmock.View, request: kmock.Request) -> bool:
    """`request in view`, as kmock decides it, without rescanning the past requests when it
    need not. For a chain of filters it is their criteria, innermost first; kmock runs every
    past request through the chain instead, so a request's cost grows with the history (15 ms
    per GET after 400 requests). Slices, groups and exclusions depend on that history, so
    they still take kmock's way."""
    criteria, node = [], view
    while not isinstance(node, kmock.Root):
        if isinstance(node, kmock.Filter):
            criteria.append(node.criteria)
        elif not isinstance(node, kmock.Priority):
            return request in view
        node = node._source
    return all(criterion(request) for criterion in reversed(criteria))


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null deletes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator whose writes keep the API server's rules (see the module docstring)."""

    _revision: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        with warnings.catch_warnings():  # kmock 0.8 reads its bundle with a deprecated call
            warnings.filterwarnings("ignore", "read_binary is deprecated", DeprecationWarning)
            self.resources.load_bundled()
        self.fallback[kmock.method.PUT] << self._serve_replace

    async def _handle(self, request: kmock.Request) -> Any:
        """kmock's dispatch (RawHandler._handle) without KubernetesEmulator._handle, which
        stores writes before any reaction is matched and without the rules above; here the
        fallbacks below write. The first reaction by priority that sees the request answers."""
        for reaction in self._by_priority():
            if reaction._disabled.is_set() or not sees(reaction._source, request):
                continue
            try:
                return await reaction(request)
            except kmock.ReactionMismatchError:  # it does not match, or is used up
                reaction._disabled.set()
            except NotImplementedError:  # it matches but has nothing to answer with
                pass
        raise NotImplementedError(f"no reaction answers {request.method} {request.url}")

    def _by_priority(self) -> list[kmock.Reaction]:
        """Highest first; kmock pads shorter priority tuples with zeros; ties keep the order."""
        width = max((len(reaction.priorities) for reaction in self._payloads), default=0)
        return sorted(
            self._payloads,
            key=lambda r: tuple(-p for p in r.priorities) + (0,) * (width - len(r.priorities)),
        )

    # Every answer here is a kmock.Response with its status: kmock 0.8 keeps the status of a
    # returned Response on the reaction, so a bare payload after a 404 would go out as a 404.

    async def _serve_fetch(self, request: kmock.Request) -> kmock.Response:
        try:
            return kmock.Response(status=200, payload=self._live(self._key(request, request.name)))
        except Refusal as refusal:
            return refusal.response()

    async def _serve_create(self, request: kmock.Request) -> kmock.Response:
        return await self._write(request, self._create)

    async def _serve_replace(self, request: kmock.Request) -> kmock.Response:
        return await self._write(request, self._replace)

    async def _serve_update(self, request: kmock.Request) -> kmock.Response:
        return await self._write(request, self._patch)

    async def _serve_delete(self, request: kmock.Request) -> kmock.Response:
        return await self._write(request, self._delete)

    async def _write(self, request: kmock.Request, write: Write) -> kmock.Response:
        """Check and store atomically; publish to watches in the order of the writes."""
        async with self._lock:
            try:
                code, event, stored = write(request)
            except Refusal as refusal:
                return refusal.response()
            if event is not None:
                await self._buses[request.resource].put({"type": event, "object": stored})
        return kmock.Response(status=code, payload=copy.deepcopy(stored))

    def _key(self, request: kmock.Request, name: str | None) -> Key:
        if request.resource is None or request.resource not in self.resources:
            raise Refusal(404, "NotFound", NO_RESOURCE)
        if not name:
            raise Refusal(
                422, "Invalid", "metadata.name: Required value: name or generateName is required"
            )
        return request.resource, request.namespace, name

    def _live(self, key: Key) -> Object:
        if key in self._objects and not self._objects[key].deleted:
            return copy.deepcopy(self._objects[key].raw)
        raise Refusal.about(key, 404, "NotFound", "{what} not found")

    def _next_version(self) -> str:
        self._revision += 1
        return str(self._revision)

    def _create(self, request: kmock.Request) -> tuple[int, str | None, Object]:
        obj = self._body(request)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            suffix = "".join(
                secrets.choice(string.ascii_lowercase + string.digits) for _ in "12345"
            )
            meta["name"] = meta["generateName"] + suffix
        key = self._key(request, meta.get("name"))
        if key in self._objects and not self._objects[key].deleted:
            raise Refusal.about(key, 409, "AlreadyExists", "{what} already exists")
        if meta.get("resourceVersion"):  # the real server answers this with a bare 500
            raise Refusal(500, "", "resourceVersion should not be set on objects to be created")
        meta |= {"uid": str(uuid.uuid4()), "creationTimestamp": _now()}
        if "status" in self.resources[key[0]].subresources:
            obj.pop("status", None)  # it is set through the status subresource only
        return 201, "ADDED", self._store(key, obj)

    def _replace(self, request: kmock.Request) -> tuple[int, str | None, Object]:
        if request.resource is not None and request.name is None:
            raise Refusal(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )
        key = self._key(request, request.name)
        stored = self._live(key)
        return self._update(request, key, stored, self._body(request))

    def _patch(self, request: kmock.Request) -> tuple[int, str | None, Object]:
        key = self._key(request, request.name)
        stored = self._live(key)
        content_type = _header(request, "Content-Type").split(";")[0].strip()
        if content_type in MERGE_PATCHES and isinstance(request.data, dict):
            return self._update(request, key, stored, merge_patch(stored, request.data))
        if content_type != JSON_PATCH or not isinstance(request.data, list):
            raise Refusal(
                415, "UnsupportedMediaType", f"the patch type {content_type!r} is not supported"
            )
        try:
            patched = jsonpatch.apply_patch(stored, request.data)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise Refusal.about(key, 422, "Invalid", f"{{what}} is invalid: {exc}") from exc
        return self._update(request, key, stored, patched)

    def _update(
        self, request: kmock.Request, key: Key, stored: Object, new: Object
    ) -> tuple[int, str | None, Object]:
        """Replace `stored` by `new` if `new` was based on it; finish a finalized deletion."""
        meta, old_meta = new.setdefault("metadata", {}), stored["metadata"]
        if meta.get("name", key[2]) != key[2] or meta.get("namespace", key[1]) != key[1]:
            raise Refusal(400, "BadRequest", "the name or namespace does not match the URL")
        if meta.get("resourceVersion", old_meta["resourceVersion"]) != old_meta["resourceVersion"]:
            raise Refusal.conflict(key, STALE)
        for field in ("uid", "creationTimestamp", "deletionTimestamp"):
            if field in old_meta:
                meta[field] = old_meta[field]
            else:
                meta.pop(field, None)
        new = self._scoped(request, key, stored, new)
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            return 200, "DELETED", self._store(key, new, deleted=True)
        return 200, "MODIFIED", self._store(key, new)

    def _scoped(self, request: kmock.Request, key: Key, stored: Object, new: Object) -> Object:
        """What a write may change: only status through /status, all but status elsewhere
        when the resource has a status subresource."""
        if request.subresource == "status":
            return _with_status(stored, new)
        if request.subresource is not None:
            raise Refusal(404, "NotFound", NO_RESOURCE)
        if "status" in self.resources[key[0]].subresources:
            return _with_status(new, stored)
        return new

    def _delete(self, request: kmock.Request) -> tuple[int, str | None, Object]:
        key = self._key(request, request.name)
        stored = self._live(key)
        options = request.data if isinstance(request.data, dict) else {}
        for field, expected in (options.get("preconditions") or {}).items():
            if expected is not None and stored["metadata"].get(field) != expected:
                raise Refusal.conflict(key, f"precondition on {field} failed")
        if not stored["metadata"].get("finalizers"):
            return 200, "DELETED", self._store(key, stored, deleted=True)
        if stored["metadata"].get("deletionTimestamp"):
            return 200, None, stored  # already being deleted: nothing changes
        stored["metadata"]["deletionTimestamp"] = _now()
        return 200, "MODIFIED", self._store(key, stored)

    def _body(self, request: kmock.Request) -> Object:
        if not isinstance(request.data, dict):
            raise Refusal(400, "BadRequest", "the request body is not a JSON object")
        body = copy.deepcopy(request.data)
        if request.namespace and body.get("metadata", {}).get("namespace") not in (
            None,
            "",
            request.namespace,
        ):
            raise Refusal(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the "
                "request",
            )
        return body

    def _store(self, key: Key, obj: Object, *, deleted: bool = False) -> Object:
        """Stamp `obj` with the next resourceVersion and keep it (or its deletion)."""
        self._check_micro_times(key, obj)
        if key[1] is not None:
            obj["metadata"]["namespace"] = key[1]
        obj["metadata"]["resourceVersion"] = self._next_version()
        if key not in self._objects:
            self._objects[key] = obj
        else:
            self._objects[key].history.append(obj)
        if deleted:
            self._objects[key].delete()
        return copy.deepcopy(obj)

    def _check_micro_times(self, key: Key, obj: Object) -> None:
        for path in MICRO_TIME_FIELDS.get((str(key[0].group), str(key[0].plural)), ()):
            value: Any = obj
            for step in path:
                value = value.get(step) if isinstance(value, dict) else None
            if value is not None and not (isinstance(value, str) and MICRO_TIME.fullmatch(value)):
                message = f'parsing time {value!r} as "2006-01-02T15:04:05.000000Z07:00"'
                raise Refusal(
                    400, "BadRequest", f"{_qualified(key[0])} cannot be handled: {message}"
                )


class RunningApiServer:
    """An `ApiServer` on 127.0.0.1, served from a thread with an event loop of its own."""

    def __init__(self) -> None:
        self.url = ""
        self.emulator: ApiServer | None = None
        self._thread = threading.Thread(target=self._serve_thread, name="kube-api", daemon=True)
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._failures: list[Exception] = []
        self._clients: list[client.ApiClient] = []

    def api_client(self) -> client.ApiClient:
        """A new client of this server (closed by `stop()`), as a separate process would have."""
        api_client = client.ApiClient(client.Configuration(host=self.url))
        self._clients.append(api_client)
        return api_client

    def start(self, timeout_s: float = 10.0) -> None:
        self._thread.start()
        if not self._ready.wait(timeout_s) or self._failures:
            self.stop()
            raise RuntimeError(f"the API server did not start: {self._failures}")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving; raise if the emulator itself failed on some request."""
        for api_client in self._clients:
            api_client.close()
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout_s)
        if self._failures:
            raise RuntimeError(f"the API server failed while serving: {self._failures!r}")

    def _serve_thread(self) -> None:
        try:
            asyncio.run(self._serve_routine())
        except Exception as exc:  # noqa: BLE001 - start() or stop() reports it
            self._failures.append(exc)
        finally:
            self._ready.set()

    async def _serve_routine(self) -> None:
        self._stopping = asyncio.Event()
        async with ApiServer() as emulator, kmock.Server(emulator) as server:
            self.emulator, self.url = emulator, str(server.url).rstrip("/")
            self._loop = asyncio.get_running_loop()
            self._ready.set()
            await self._stopping.wait()
            self._failures.extend(emulator.errors)


@contextlib.contextmanager
def serve_in_thread() -> Iterator[RunningApiServer]:
    server = RunningApiServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
