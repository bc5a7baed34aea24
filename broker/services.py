"""Every service of a broker that does not depend on its role, built once here and handed
out: to the `Broker` (broker.py), which runs them through role changes, and to the
protocol edge (server.py wires each handler with the ones it uses).

What depends on the role is the Broker's own: replication, the controller link or the
slave-acting-master watch, the write path (which waits on replication), the leadership
gate and the check-back relay to the other replicas.
"""

from __future__ import annotations

from dataclasses import dataclass

from capstan.broker.catalog import Catalog
from capstan.broker.client_offsets import ClientOffsets
from capstan.broker.connected_clients import ConnectedClients, NoClients
from capstan.broker.consumer_groups.membership import GroupMembership
from capstan.broker.consumer_groups.queue_locks import QueueLocks
from capstan.broker.long_polling import ArrivalNotifier
from capstan.broker.metrics import BrokerMetrics
from capstan.broker.pop.pop_service import PopService
from capstan.broker.pop.pop_state import PopState
from capstan.broker.pop.receipt_handle import HandleCodec
from capstan.broker.queue_reads import QueueReader
from capstan.broker.replication.escape import EscapeBridge
from capstan.broker.static_topics import OrderGate, StaticTopics
from capstan.broker.store.async_append import AsyncAppender
from capstan.broker.store.message_store import MessageStore
from capstan.broker.timer.timer_service import TimerService
from capstan.broker.transaction.transaction_service import TransactionService
from capstan.common.broker_settings import BrokerSettings


@dataclass(frozen=True, eq=False)
class BrokerServices:
    settings: BrokerSettings
    store: MessageStore
    metrics: BrokerMetrics
    clients: ConnectedClients
    """The sessions of the clients the protocol edge serves."""
    appender: AsyncAppender
    arrivals: ArrivalNotifier
    catalog: Catalog
    static_topics: StaticTopics
    reader: QueueReader
    offsets: ClientOffsets
    """Offsets as clients name them (logic offsets on a static topic's queues)."""
    members: GroupMembership
    """The SDK consumers of each group."""
    queue_locks: QueueLocks
    pop_state: PopState
    handles: HandleCodec
    """Signs receipt and recall handles (one key, copied to slaves)."""
    order_gate: OrderGate
    """Holds FIFO groups in order across a static topic's moves (static_order_checks.py)."""
    pop: PopService
    timer: TimerService
    transactions: TransactionService
    escape: EscapeBridge
    """Where a slave acting for an absent master stores what its duties produce."""


def build_services(
    settings: BrokerSettings,
    store: MessageStore,
    metrics: BrokerMetrics | None = None,
    clients: ConnectedClients | None = None,
) -> BrokerServices:
    """The services of a broker on the open `store`; `clients` are the protocol edge's
    sessions (none for a broker that serves no client, as in tests of the services)."""
    state_dir = settings.data_path / "state"
    arrivals = ArrivalNotifier()
    pop_state = PopState(state_dir / "pop", settings.pop.journal_compact_bytes)
    handles = HandleCodec.from_key_file(state_dir / "handle.key")
    static_topics = StaticTopics(store.topics, store.queue_mappings, settings.broker_name)
    order_gate = OrderGate(static_topics, store.consumer_offsets.query)
    catalog = Catalog(store.topics, store.subscription_groups, settings)
    queue_locks = QueueLocks(settings.consumer_groups.queue_lock_expiry_s)

    def reads_in_order(group: str, topic: str, queue_id: int) -> bool:
        """A FIFO group, or one whose member holds the queue's lock (orderly consumers)."""
        config = catalog.groups.get(group)
        if config is not None and config.consume_message_orderly:
            return True
        return queue_locks.holder(group, (topic, queue_id)) is not None

    return BrokerServices(
        settings=settings,
        store=store,
        metrics=metrics or BrokerMetrics(settings.broker_name, settings.store.store_host),
        clients=clients or NoClients(),
        appender=AsyncAppender(store),
        arrivals=arrivals,
        catalog=catalog,
        static_topics=static_topics,
        reader=QueueReader(store, arrivals, static_topics, order_gate, reads_in_order),
        offsets=ClientOffsets(store, static_topics),
        members=GroupMembership(settings.consumer_groups.member_expiry_s),
        queue_locks=queue_locks,
        pop_state=pop_state,
        handles=handles,
        order_gate=order_gate,
        pop=PopService(store, pop_state, handles, order_gate),
        timer=TimerService(
            store, state_dir / "timer_progress.json", settings.timer.progress_interval_ms
        ),
        transactions=TransactionService(
            store, state_dir / "transaction_progress.json", settings.transaction
        ),
        escape=EscapeBridge(settings.broker_name, settings.replication.escape_address_list),
    )
