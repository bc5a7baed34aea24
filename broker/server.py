"""The broker process: gRPC and HTTP servers around the Broker, with a clean lifecycle.

Start order: the gRPC server comes up first with health NOT_SERVING, so probes get an
answer while the store recovers; then the store opens (recovery runs in a thread), the
services start, and health turns SERVING. SIGTERM/SIGINT: health NOT_SERVING, still
listening until `shutdown_delay_s` after the signal (for Services to stop sending new
connections), then no new calls, running calls get `shutdown_grace_s`, then services stop
and the store closes (flush, checkpoint, clean-stop mark). Under a controller the broker
first steps aside: a master hands its leadership to a caught-up replica, a slave leaves the
SyncStateSet (replication/handover.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from capstan.broker.broker import Broker
from capstan.broker.edge.access.guard import AccessGuard
from capstan.broker.edge.forwarding import Forwarder
from capstan.broker.edge.late_binding import UNSERVED_BY
from capstan.broker.edge.rpc_metrics import RpcTiming
from capstan.broker.edge.v1.admin_servicer import AdminServicer
from capstan.broker.edge.v1.consumer_servicer import ConsumerServicer
from capstan.broker.edge.v1.endpoint import add_late_bound_v1, v1_forwarders
from capstan.broker.edge.v1.older_reads import OlderReads
from capstan.broker.edge.v1.pull_servicer import PullServicer
from capstan.broker.edge.v2.clients import ClientRegistry
from capstan.broker.edge.v2.cluster_routes import ClusterRoutes
from capstan.broker.edge.v2.consume import ConsumeHandler
from capstan.broker.edge.v2.endpoint import add_late_bound_messaging, messaging_forwarder
from capstan.broker.edge.v2.group_pass_on import GroupPassOn
from capstan.broker.edge.v2.messaging_servicer import MessagingServicer
from capstan.broker.edge.v2.older_items import OlderItems
from capstan.broker.edge.v2.pull import PullHandler
from capstan.broker.edge.v2.recall import RecallHandler
from capstan.broker.edge.v2.route import GroupView, RouteHandler
from capstan.broker.edge.v2.send import SendHandler
from capstan.broker.edge.v2.telemetry import SessionHandler
from capstan.broker.edge.v2.transaction import TransactionHandler
from capstan.broker.group_masters import GroupMasters
from capstan.broker.group_offsets import GroupOffsets
from capstan.broker.metrics import BrokerMetrics
from capstan.broker.replication.master_stream import ReplicationService
from capstan.broker.replication.peer_service import ReplicaPeersService
from capstan.broker.services import BrokerServices, build_services
from capstan.broker.store.message_store import MessageStore
from capstan.common.broker_settings import BrokerSettings
from capstan.common.grpc_guard import RequestGuard
from capstan.common.grpc_keepalive import SERVER_OPTIONS
from capstan.common.grpc_limits import MESSAGE_SIZE_OPTIONS
from capstan.common.grpc_server_log import quiet_client_gone
from capstan.common.grpc_services import BROKER_SERVICES, announce
from capstan.common.http_endpoints import HttpEndpoints
from capstan.common.listen import add_grpc_port, listen_errors
from capstan.common.loop_watch import LoopWatch
from capstan.security import peers
from capstan.security.credentials import load_credentials_file
from capstan.security.tls import https_context, server_tls

log = logging.getLogger(__name__)

SERVICE_NAME = "apache.rocketmq.v2.MessagingService"


class BrokerServer:
    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self.broker: Broker | None = None
        self.services: BrokerServices | None = None
        self.store: MessageStore | None = None
        self.grpc_port = 0
        self.http_port = 0
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self._http: HttpEndpoints | None = None
        self.loop_watch: LoopWatch | None = None
        """Says when the event loop stops running (started with the server)."""
        self._ready = False
        self._stopping = False
        self._draining = False  # set once the broker stops taking work: watch streams end
        self._forwarders: list[Forwarder] = []
        controllers = self.settings.replication.controller_addresses
        self._cluster_routes = ClusterRoutes(controllers) if controllers else None
        self._older_items: OlderItems | None = None
        self._clients: ClientRegistry | None = None
        self.metrics = BrokerMetrics(settings.broker_name, f"{_advertised(settings)}")

    async def start(self) -> None:
        s = self.settings
        self._access = AccessGuard(
            s.auth, s.broker_name, lambda reason: self.metrics.auth_failures.labels(reason).inc()
        )
        quiet_client_gone()  # grpc's traceback for a client gone as its call ended
        self._server = grpc.aio.server(
            # The access guard first: it answers a call that fails authentication before
            # anything else looks at it, and hands on the cached handlers of the others.
            interceptors=[
                *([self._access] if s.auth.enabled else []),  # off: no cost at all
                RpcTiming(self.metrics),
                RequestGuard(UNSERVED_BY),
            ],
            options=[
                *MESSAGE_SIZE_OPTIONS,
                *SERVER_OPTIONS,  # the SDK's keepalive pings
                ("grpc.so_reuseport", 0),
            ],
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        self._messaging = add_late_bound_messaging(self._server)
        v1 = add_late_bound_v1(self._server)
        self._admin, self._pull, self._consumer = v1.admin, v1.pull, v1.consumer
        self._replication, self._peers = v1.replication, v1.peers
        announce(self._server, BROKER_SERVICES)
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        peers.configure(s.tls, s.auth.cluster_secret_file if s.auth.enabled else "")
        self._tls = server_tls(s.tls)
        credentials = self._tls.credentials() if self._tls is not None else None
        self.grpc_port = add_grpc_port(self._server, s.listen_host, s.grpc_port, credentials)
        # The store records which host:port stored each message; use the real port.
        store_settings = s.store
        if store_settings.store_host.endswith(":8081") and self.grpc_port != 8081:
            store_settings = dataclasses.replace(
                store_settings, store_host=f"{_advertised(s)}:{self.grpc_port}"
            )
        self.loop_watch = LoopWatch(asyncio.get_running_loop())
        self.loop_watch.start()
        await self._server.start()
        if s.http_port >= 0:
            https = https_context(s.tls)
            with listen_errors(s.listen_host, s.http_port, "HTTP"):
                self._http = HttpEndpoints(
                    s.listen_host,
                    s.http_port,
                    self._registry(),
                    self._healthy,
                    self._is_ready,
                    asyncio.get_running_loop(),
                    None if https is None else https.current,
                )
            self._http.start()
            self.http_port = self._http.port
        log.info("recovering the store in %s", s.data_path)
        self.store = await asyncio.to_thread(MessageStore, s.data_path / "store", store_settings)
        log.info("store ready: %s", self.store.recovery.summary())
        self._open_access(self.store)
        self._clients = ClientRegistry(s.store.store_host)
        self.services = build_services(s, self.store, self.metrics, self._clients)
        self.broker = Broker(self.services, address=f"{_advertised(s)}:{self.grpc_port}")
        await self.broker.start()
        self._wire_services()
        self._ready = True
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)

    def _open_access(self, store: MessageStore) -> None:
        auth = self.settings.auth
        if not auth.enabled:
            log.warning(
                "authentication is off: anyone who reaches this broker may send, consume "
                "and administer it (set auth.enabled for a deployment)"
            )
            return
        if auth.init_user_file:
            admin = load_credentials_file(Path(auth.init_user_file).expanduser())
            if store.users.ensure_super_user(admin.access_key, admin.secret_key):
                log.info("created the super user %s from %s", admin.access_key, auth.init_user_file)
        self._access.bind(store.users, peers.peer_security().identity)
        log.info("authentication is on: %d users", len(store.users))

    def _wire_services(self) -> None:
        """The composition root: each servicer and handler gets the services it uses."""
        assert self._server is not None and self.broker is not None
        assert self.services is not None
        broker, services, s = self.broker, self.services, self.settings
        store, catalog, writes = services.store, services.catalog, broker.writes
        store_host = s.store.store_host
        forward = broker.master_to_forward_to if broker.forwards else None
        self._forwarders = [
            messaging_forwarder(),
            *v1_forwarders(),
            messaging_forwarder(),
            *v1_forwarders()[1:],
        ]
        messaging, admin, pull, consumer, group_forwarder, older_pulls, older_consumers = (
            self._forwarders
        )
        settled = broker.calls_may_proceed
        moves = broker.replication.leadership_moved if broker.replication is not None else None
        clients = self._clients
        assert clients is not None  # made with the store, before the services
        masters = (
            broker.group_links.masters if broker.group_links is not None else GroupMasters(None)
        )
        self._older_items = OlderItems(masters, s.broker_name)
        group = GroupView(
            s.broker_name,
            self.grpc_port,
            s.advertised_host,
            broker.group_addresses,
            broker.group_writable,
            s.route_endpoint,
        )
        servicer = MessagingServicer(
            routes=RouteHandler(catalog, group, services.static_topics, self._cluster_routes),
            sessions=SessionHandler(
                clients, store.subscription_groups, s.max_message_body_bytes, s.pop
            ),
            send=SendHandler(
                catalog,
                writes,
                services.timer,
                services.transactions,
                services.handles,
                s.max_message_body_bytes,
                s.timer.max_delay_ms,
                services.static_topics,
                GroupPassOn(group_forwarder, masters),
            ),
            transactions=TransactionHandler(services.transactions),
            recall=RecallHandler(catalog, services.timer, services.handles),
            consume=ConsumeHandler(
                catalog,
                services.pop,
                services.arrivals,
                writes.put_dead_letter,
                self.metrics,
                s.pop,
                store_host,
                services.static_topics,
                self._older_items,
                broker.pop_state_on_slaves,
            ),
            pull=PullHandler(
                catalog,
                services.reader,
                services.offsets,
                self.metrics,
                s.max_pull_long_polling_ms,
                store_host,
            ),
        )
        # Routes are answered by every replica, and a client's Telemetry session stays where
        # it lands, so it outlives the master (check-backs reach it through check_relay.py);
        # everything else is the master's.
        local = frozenset({"QueryRoute", "Telemetry"})
        self._messaging.bind(servicer, forward, messaging, local, settled, moves)
        self._admin.bind(
            AdminServicer(
                store,
                GroupOffsets(
                    store,
                    services.offsets,
                    services.pop,
                    services.members,
                    lambda: broker.is_master,
                ),
                services.members,
                clients,
                lambda: (services.transactions.pending, services.timer.pending),
                s.broker_name,
                lambda: broker.is_master,
                broker.catalog_on_slaves,
                broker.hand_over_to if broker.controller_link is not None else None,
                services.static_topics,
                broker.placement.take,
            ),
            forward,
            admin,
            settled=settled,
            moves=moves,
        )
        older_reads = OlderReads(masters, older_pulls, older_consumers, s.broker_name)
        self._pull.bind(
            PullServicer(
                catalog, services.reader, self.metrics, s.max_pull_long_polling_ms, older_reads
            ),
            forward,
            pull,
            settled=settled,
            moves=moves,
        )
        self._consumer.bind(
            ConsumerServicer(
                catalog,
                store,
                services.offsets,
                services.members,
                services.queue_locks,
                broker.forget_consumer,
                writes.put_dead_letter,
                services.timer,
                self.metrics,
                lambda: self._draining or broker.stopping,
                older_reads,
            ),
            forward,
            consumer,
            settled=settled,
            moves=moves,
        )
        self._replication.bind(ReplicationService(broker.replication, broker.state_copy))
        self._peers.bind(
            ReplicaPeersService(
                s.broker_name,
                broker.acting_master,
                lambda: store.max_phys_offset,
                lambda: broker.is_master,
                catalog.topic,
                broker.placement.take,  # a static topic's in a logic queue this group leads
                clients.check_back,
            )
        )

    async def _set_health(self, state: int) -> None:
        await self._health.set("", state)
        await self._health.set(SERVICE_NAME, state)

    def _registry(self) -> CollectorRegistry:
        return self.metrics.registry

    async def _wait_out_shutdown_delay(self, signalled: float) -> None:
        """Still listening, until `shutdown_delay_s` after the signal: a Service routes new
        connections here for a moment after the pod left its endpoints."""
        left = signalled + self.settings.shutdown_delay_s - time.monotonic()
        if left > 0:
            log.info("stop: still taking connections for %.1f s (shutdown_delay_s)", left)
            await asyncio.sleep(left)

    def _healthy(self) -> bool:
        """The store takes writes, and the controller link (if any) is not stuck in a
        round: a broker the controller no longer hears from is restarted, not left."""
        link = self.broker.controller_link if self.broker is not None else None
        if link is not None and link.stuck_s() > 0:
            return False
        return self.store is None or self.store.healthy

    def _is_ready(self) -> bool:
        return self._ready and not self._stopping and self._healthy()

    async def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        signalled = time.monotonic()
        if self.broker is not None:
            await self.broker.step_aside()  # still serving: calls wait, then go to the new master
        self._ready = False
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self._wait_out_shutdown_delay(signalled)
        self._draining = True
        if self.services is not None:
            self.services.arrivals.notify_all()  # long polls answer before the server stops
            self.services.members.wake_all()  # watch streams end now, not at the grace's end
        if self._clients is not None:
            ended = self._clients.end_streams()  # clients open theirs again on another broker
            log.info("stop: %d client Telemetry stream(s) ended", ended)
        if self.broker is not None and self.broker.replication is not None:
            self.broker.replication.stop()
        if self._server is not None:
            began = time.monotonic()
            await self._server.stop(self.settings.shutdown_grace_s)
            log.info("stop: the gRPC server's calls ended in %.2f s", time.monotonic() - began)
        for forwarder in self._forwarders:
            await forwarder.close()
        if self._cluster_routes is not None:
            await self._cluster_routes.close()
        if self._older_items is not None:
            await self._older_items.close()
        if self.broker is not None:
            await self.broker.stop()
        if self.store is not None:
            await asyncio.to_thread(self.store.close)
        if self._http is not None:
            self._http.stop()
        if self.loop_watch is not None:
            self.loop_watch.stop()
        log.info("broker stopped")


def _advertised(s: BrokerSettings) -> str:
    if s.advertised_host:
        return s.advertised_host
    return "127.0.0.1" if s.listen_host in ("0.0.0.0", "::", "") else s.listen_host
