"""A consumer's presence in its group: heartbeats, and news of the other members.

Every `heartbeat_interval_s` the client sends a heartbeat (its subscriptions, message model
and the queues it owns) to every broker that serves one of its topics; the broker counts it
a member until it stops. One WatchGroup stream per broker brings the member list whenever
it changes, and `on_change` is called, which is how a join or a death reaches the other
members' rebalance within moments rather than at their next periodic rebalance. The same
stream brings an admin's offset reset (`capstan group reset-offset`), handed to `on_reset`
with the broker's address and (topic, queue id, offset) per queue. A stream that breaks is
opened again after a short pause.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from capstan.client.consumer.broker_calls import BrokerCalls, iterate_watch
from capstan.client.consumer.message_queue import MessageQueue
from capstan.client.errors import ClientError

log = logging.getLogger(__name__)

WATCH_RETRY_S = 1.0


class GroupSession:
    def __init__(
        self,
        calls: BrokerCalls,
        message_model: int,
        consume_type: int,
        orderly: bool,
        subscriptions: Callable[[], dict[str, str]],
        owned: Callable[[], Iterable[MessageQueue]],
        addresses: Callable[[], set[str]],
        on_change: Callable[[], None],
        interval_s: float,
        on_reset: Callable[[str, list[tuple[str, int, int]]], None] | None = None,
    ) -> None:
        self._calls = calls
        self._model = message_model
        self._consume_type = consume_type
        self._orderly = orderly
        self._subscriptions = subscriptions
        self._owned = owned
        self._addresses = addresses
        self._on_change = on_change
        self._on_reset = on_reset
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._watches: dict[str, object] = {}
        self._versions: dict[str, int] = {}
        self._beat_thread = threading.Thread(
            target=self._beat_routine, name="capstan-heartbeat", daemon=True
        )

    def start(self) -> None:
        self.heartbeat_all()
        self._beat_thread.start()

    def stop(self, unregister: bool = True) -> None:
        self._stopped.set()
        with self._lock:
            watches, self._watches = list(self._watches.values()), {}
        for call in watches:
            call.cancel()  # type: ignore[attr-defined]
        if unregister:
            for address in self._addresses():
                try:
                    self._calls.unregister(address)
                except ClientError as exc:
                    log.warning("could not leave the group at %s: %s", address, exc)
        self._beat_thread.join(5)

    def heartbeat_all(self) -> None:
        subscriptions = self._subscriptions()
        owned = list(self._owned())
        for address in sorted(self._addresses()):
            try:
                version = self._calls.heartbeat(
                    address, self._model, self._consume_type, self._orderly, subscriptions, owned
                )
            except ClientError as exc:
                log.warning("heartbeat to %s failed: %s", address, exc)
                continue
            missed = self._versions.get(address, version) != version
            self._versions[address] = version
            self._ensure_watch(address)
            if missed:
                self._on_change()

    def _beat_routine(self) -> None:
        while not self._stopped.wait(self._interval_s):
            try:
                self.heartbeat_all()
            except Exception:
                log.exception("heartbeat round failed")

    def _ensure_watch(self, address: str) -> None:
        with self._lock:
            if address in self._watches or self._stopped.is_set():
                return
            call = self._calls.watch(address)
            self._watches[address] = call
        threading.Thread(
            target=self._watch_routine, args=(address, call), name="capstan-watch", daemon=True
        ).start()

    def _watch_routine(self, address: str, call: object) -> None:
        for update in iterate_watch(call):
            if update.HasField("offset_reset") and self._on_reset is not None:
                reset = [(o.topic, o.queue_id, o.offset) for o in update.offset_reset.offsets]
                try:
                    self._on_reset(address, reset)
                except Exception:
                    log.exception("applying an offset reset from %s failed", address)
            version = int(update.members_version)
            changed = self._versions.get(address) != version
            self._versions[address] = version
            if changed:
                self._on_change()
        with self._lock:
            if self._watches.get(address) is call:
                del self._watches[address]
        if not self._stopped.wait(WATCH_RETRY_S):
            # The broker dropped us with the stream; say we are here and watch again.
            self.heartbeat_all()
