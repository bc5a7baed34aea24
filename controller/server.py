"""The controller process (`capstan controller`): capstan.v1.Controller over gRPC, the
leader lease, the dead-master check, and HTTP /metrics, /healthz, /readyz. Its gRPC port
also serves the clients' QueryRoute (route_front.py) and capstan.v1.Admin passed to every
broker group (admin_front.py).

Several controller replicas may share one state store; the one holding the lease answers,
the others refuse with FAILED_PRECONDITION. The leader renews every third of the lease and
checks every `check_interval_ms` for groups whose master stopped beating. Heartbeats live in
memory, so a controller that has just become leader first waits one broker timeout before
it judges any master dead: a broker cannot be blamed for beats sent to another replica.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, Counter, Gauge
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.common.data_format import DataFormatError
from capstan.common.errors import CapstanError
from capstan.common.grpc_guard import RequestGuard
from capstan.common.grpc_keepalive import SERVER_OPTIONS
from capstan.common.grpc_server_log import quiet_client_gone
from capstan.common.grpc_services import CONTROLLER_SERVICES, announce
from capstan.common.http_endpoints import HttpEndpoints
from capstan.common.listen import add_grpc_port, listen_errors
from capstan.common.loop_watch import LoopWatch
from capstan.controller.admin_front import AdminFront
from capstan.controller.broker_liveness import BrokerLiveness
from capstan.controller.cluster_guard import REFUSAL_REASONS, ClusterGuard
from capstan.controller.controller_service import ControllerService
from capstan.controller.replica_manager import ReplicaManager
from capstan.controller.route_front import RouteFront
from capstan.controller.settings import ControllerSettings
from capstan.controller.state_format import FormattedStateStore
from capstan.controller.state_store import FileStateStore, StateStore
from capstan.controller.static_topic_book import StaticTopicBook
from capstan.security import peers
from capstan.security.tls import https_context, server_tls
from capstan.v1 import admin_pb2_grpc as admin_grpc
from capstan.v1 import controller_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

UNSERVED_BY = "the Capstan controller"
UNHEARD_GRACE_TIMEOUTS = 5
"""For this many broker timeouts after it starts leading, the controller does not depose a
master it has not heard from yet, unless another replica of the group has been beating for a
whole timeout (ReplicaManager.check_masters): time for every broker to find it. A master
heard and then silent is judged after one timeout, as always; a group none of whose brokers
comes is judged after this grace (30 s at the default 6 s timeout)."""


def _state_at(settings: ControllerSettings) -> str:
    state = settings.state
    if state.backend == "file":
        return str(Path(state.directory).expanduser().resolve())
    return f"configmap {state.namespace}/{state.name}"


def open_state_store(settings: ControllerSettings) -> StateStore:
    state = settings.state
    if state.backend == "file":
        return FileStateStore(Path(state.directory).expanduser().resolve())
    from capstan.controller.kubernetes_state_store import state_store_in_cluster

    return state_store_in_cluster(state.namespace, state.name)


class ControllerMetrics:
    def __init__(self, manager: ReplicaManager, leading: Callable[[], bool]) -> None:
        self.registry = CollectorRegistry()
        self.elections = Counter(
            "capstan_controller_elections",
            "Changes of master decided by this controller (a dead master replaced, a "
            "switchover, or a group left without one)",
            ["group"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "capstan_controller_leader",
            "1 while this controller replica holds the leader lease",
            registry=self.registry,
        )
        self.leader.set_function(lambda: 1.0 if leading() else 0.0)
        self.master_epoch = Gauge(
            "capstan_controller_master_epoch", "The group's master epoch", ["group"],
            registry=self.registry,
        )  # fmt: skip
        self.sync_state_set_size = Gauge(
            "capstan_controller_sync_state_set_size",
            "Brokers in the group's SyncStateSet (the master included)",
            ["group"],
            registry=self.registry,
        )
        self.has_master = Gauge(
            "capstan_controller_group_has_master", "1 while the group has a master", ["group"],
            registry=self.registry,
        )  # fmt: skip
        self.replica_alive = Gauge(
            "capstan_controller_replica_alive",
            "1 while the replica's heartbeats arrive within broker_timeout_ms (on the leader)",
            ["group", "broker_id"],
            registry=self.registry,
        )
        self.auth_failures = Counter(
            "capstan_auth_failures",
            "Calls that change the cluster refused for not carrying the cluster's signature, "
            "by reason (missing, malformed, unknown_user, wrong_signature, expired, ...)",
            ["reason"],
            registry=self.registry,
        )
        for reason in REFUSAL_REASONS:
            self.auth_failures.labels(reason)
        self._manager = manager

    def refresh(self) -> None:
        for group in self._manager.group_names():
            view = self._manager.view(group)
            info = view.info
            self.master_epoch.labels(group).set(info.master_epoch)
            self.sync_state_set_size.labels(group).set(len(info.sync_state_set))
            self.has_master.labels(group).set(0 if info.master_id is None else 1)
            for replica in view.replicas:
                alive = self.replica_alive.labels(group, str(replica.broker_id))
                alive.set(1 if replica.alive else 0)


STATIC_TOPICS_KEEP_S = 3.0
"""How often the leading controller brings static topics' groups in step, in seconds."""


def default_controller_id(settings: ControllerSettings) -> str:
    """The lease name of a controller not given one: its host, listen address and gRPC
    port. The port is bound without SO_REUSEPORT before the lease is first tried, so while
    a process holds that name no other can: one restarted after a crash (a supervisor's
    restart, `capstan up`) takes its lease back at once instead of waiting it out, and a
    master lost with it is replaced a lease sooner. With port 0 (any free port), the host
    and process id."""
    host = socket.gethostname()
    if settings.grpc_port:
        return f"{host}:{settings.listen_host}:{settings.grpc_port}"
    return f"{host}-{os.getpid()}"


class ControllerServer:
    def __init__(self, settings: ControllerSettings, store: StateStore | None = None) -> None:
        self.settings = settings
        self.controller_id = settings.controller_id or default_controller_id(settings)
        self.store = FormattedStateStore(
            store if store is not None else open_state_store(settings), _state_at(settings)
        )
        self.liveness = BrokerLiveness(settings.broker_timeout_ms / 1000)
        self.manager = ReplicaManager(self.store, self.liveness, settings.unclean_election)
        self.manager.on_election = lambda group: self.metrics.elections.labels(group).inc()
        self.metrics = ControllerMetrics(self.manager, self.is_leader)
        self.grpc_port = 0
        self.http_port = 0
        self._leading_since: float | None = None
        self._lease_held_until = 0.0
        """Until when (time.monotonic) the lease last taken or renewed is surely this
        replica's: its duration from the moment the call that took it began."""
        self._server: grpc.aio.Server | None = None
        self._http: HttpEndpoints | None = None
        self.loop_watch: LoopWatch | None = None
        """Says when the event loop stops running (started with the server)."""
        self._health = health.aio.HealthServicer()
        self._tasks: list[asyncio.Task[None]] = []
        self._routes = RouteFront(self.manager)
        self._admin = AdminFront(
            self.manager, self.controller_id, self.is_leader, StaticTopicBook(self.store)
        )

    def is_leader(self) -> bool:
        """Holding the lease, and not past its end as this replica knows it: a renewal
        that hangs (a slow API server, a stopped process) does not leave it acting as
        leader while another replica may already have taken the lapsed lease."""
        return self._leading_since is not None and time.monotonic() < self._lease_held_until

    async def start(self) -> None:
        s = self.settings
        try:  # state a newer Capstan wrote is refused here, before anything is served
            await asyncio.to_thread(self.store.read)
        except DataFormatError:
            raise
        except (CapstanError, OSError) as exc:
            log.warning("cannot read the controller state yet: %s", exc)
        # Without SO_REUSEPORT a second controller on the same port fails to start instead
        # of sharing the port (and the connections) with the first.
        cluster_secret = s.auth.cluster_secret_file if s.auth.enabled else ""
        identity = peers.configure(s.tls, cluster_secret).identity
        interceptors: list[grpc.aio.ServerInterceptor] = [RequestGuard(UNSERVED_BY)]
        if identity is not None:  # without authentication nothing is checked, at no cost
            counted = self.metrics.auth_failures
            guard = ClusterGuard(
                identity.secret_key,
                s.auth.max_clock_skew_s,
                lambda reason: counted.labels(reason).inc(),
            )
            interceptors.insert(0, guard)
        quiet_client_gone()  # grpc's traceback for a client gone as its call ended
        self._server = grpc.aio.server(
            interceptors=interceptors, options=[*SERVER_OPTIONS, ("grpc.so_reuseport", 0)]
        )
        pb_grpc.add_ControllerServicer_to_server(  # type: ignore[no-untyped-call]
            ControllerService(
                self.manager,
                self.controller_id,
                self.is_leader,
                s.probe_lost_masters,
                s.silent_master_ms / 1000,
            ),
            self._server,
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        svc_grpc.add_MessagingServiceServicer_to_server(self._routes, self._server)
        admin_grpc.add_AdminServicer_to_server(self._admin, self._server)  # type: ignore[no-untyped-call]
        announce(self._server, CONTROLLER_SERVICES)
        tls = server_tls(s.tls)
        credentials = tls.credentials() if tls is not None else None
        self.grpc_port = add_grpc_port(self._server, s.listen_host, s.grpc_port, credentials)
        self.loop_watch = LoopWatch(asyncio.get_running_loop())
        self.loop_watch.start()
        await self._server.start()
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        if s.http_port >= 0:
            https = https_context(s.tls)
            with listen_errors(s.listen_host, s.http_port, "HTTP"):
                self._http = HttpEndpoints(
                    s.listen_host,
                    s.http_port,
                    self.metrics.registry,
                    lambda: True,
                    self.is_leader,
                    asyncio.get_running_loop(),
                    None if https is None else https.current,
                )
            self._http.start()
            self.http_port = self._http.port
        if identity is None:  # said once every port is bound, so a failed start says one line
            log.warning(
                "authentication is off: anyone who reaches this controller may register "
                "brokers and move masters (set auth.enabled for a deployment)"
            )
        self._tasks = [
            asyncio.create_task(self._lease_routine(), name="controller-lease"),
            asyncio.create_task(self._check_routine(), name="controller-check"),
            asyncio.create_task(self._static_topics_routine(), name="controller-static-topics"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.is_leader():
            try:
                await asyncio.to_thread(self.store.resign, self.controller_id)
            except Exception:
                log.exception("could not give up the leader lease")
        self._leading_since = None
        if self._server is not None:
            await self._server.stop(2)
        await self._routes.close()
        await self._admin.close()
        if self._http is not None:
            self._http.stop()
        if self.loop_watch is not None:
            self.loop_watch.stop()

    async def _lease_routine(self) -> None:
        duration = self.settings.lease_duration_s
        while True:
            asked = time.monotonic()
            try:
                held = await asyncio.to_thread(self.store.try_lead, self.controller_id, duration)
            except (CapstanError, OSError) as exc:
                log.warning("cannot reach the controller state to renew the lease: %s", exc)
                held = False
            lapsed = time.monotonic() >= self._lease_held_until
            if held and self._leading_since is not None and lapsed:
                # Renewed only after the lease had lapsed: calls were refused meanwhile and
                # heartbeats went unheard, so this lead starts afresh (the check's grace).
                log.warning("controller %s renewed its lease after it lapsed", self.controller_id)
                self._leading_since = None
            if held:
                self._lease_held_until = asked + duration
            if held and self._leading_since is None:
                self._leading_since = time.monotonic()
                log.info("controller %s leads", self.controller_id)
                try:
                    if await asyncio.to_thread(self.store.commit_format):
                        log.warning("the controller state moved to its current format")
                except (CapstanError, OSError) as exc:
                    log.warning("cannot write the controller state's format yet: %s", exc)
            elif not held and self._leading_since is not None:
                self._leading_since = None
                log.warning("controller %s lost the lead", self.controller_id)
            await asyncio.sleep(duration / 3)

    async def _static_topics_routine(self) -> None:
        """While leading: finish static-topic moves that stopped between their steps and
        bring groups that are behind up to the book's mappings (controller/static_topics.py)."""
        while True:
            await asyncio.sleep(STATIC_TOPICS_KEEP_S)
            if not self.is_leader():
                continue
            try:
                await self._admin.keep_static_topics()
            except (CapstanError, OSError, grpc.RpcError) as exc:
                log.warning("could not bring static topics' groups in step: %s", exc)

    async def _check_routine(self) -> None:
        grace = self.settings.broker_timeout_ms / 1000
        interval = self.settings.check_interval_ms / 1000
        last_tick = time.monotonic()
        judge_after = 0.0
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            frozen = now - last_tick - interval
            last_tick = now
            if frozen > max(1.0, grace / 2):
                # The process did not run (stopped, a VM pause, swapping): heartbeats sent
                # meanwhile went unheard, so silence proves nothing until brokers are heard.
                judge_after = now + grace
                log.warning(
                    "controller did not run for %.1f s; judging brokers again in %.1f s",
                    frozen,
                    grace,
                )
            since = self._leading_since
            if since is None or not self.is_leader() or now - since < grace or now < judge_after:
                continue
            judge_unheard = now - since >= UNHEARD_GRACE_TIMEOUTS * grace
            try:
                elections = await asyncio.to_thread(self.manager.check_masters, judge_unheard)
                for election in elections:
                    log.warning(
                        "group %s: master %s, epoch %d (%s)",
                        election.info.group,
                        election.master_id,
                        election.info.master_epoch,
                        election.reason,
                    )
                await asyncio.to_thread(self.metrics.refresh)
            except Exception:
                log.exception("master check failed; retrying")
