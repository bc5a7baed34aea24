"""Slave-acting-master's pieces: who acts, the record a slave keeps, the copy of queue locks,
escaped messages and the settings that turn it on."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from capstan.broker.consumer_groups.queue_locks import QueueLocks
from capstan.broker.handed_messages import from_handed, to_handed
from capstan.broker.replication.acting_master import ActingRecord, should_act
from capstan.broker.replication.peer_service import ReplicaPeersService
from capstan.broker.store.message import Message
from capstan.broker.store.status import PutResult, PutStatus
from capstan.broker.store.topic_config import TopicConfig
from capstan.common.broker_settings import ReplicationSettings
from capstan.v1 import replication_pb2 as rpb
from capstan.v1.handed_message_pb2 import HandedMessage


@pytest.mark.parametrize("own", [1, 2, 3])
@pytest.mark.parametrize("master_alive", [True, False])
def test_the_live_slave_with_the_smallest_id_acts_only_while_the_master_is_gone(own, master_alive):
    others = [i for i in (1, 2, 3) if i != own]
    for n in range(len(others) + 1):
        for live in itertools.combinations(others, n):
            expected = not master_alive and all(own < i for i in live)
            assert should_act(own, master_alive, live) is expected, (own, live)


def test_exactly_one_slave_acts_whichever_are_alive():
    for n in range(1, 4):
        for live in itertools.combinations((1, 2, 3), n):
            acting = [i for i in live if should_act(i, False, [j for j in live if j != i])]
            assert acting == [min(live)]


def test_the_record_survives_a_restart_and_a_damaged_one_is_an_error(tmp_path: Path):
    path = tmp_path / "acting_master.json"
    assert ActingRecord.load(path) == ActingRecord(0, -1, 0)
    ActingRecord(generation=4, acted_over=3, acted_since_ms=17).save(path)
    assert ActingRecord.load(path) == ActingRecord(4, 3, 17)
    path.write_text('{"generation": 4')
    with pytest.raises(ValueError, match="unreadable"):
        ActingRecord.load(path)


def test_copied_locks_keep_their_holders_and_their_remaining_time():
    master = QueueLocks(expiry_s=60)
    assert master.lock("G", "c1", [("T", 0), ("T", 1)], now=100.0) == [("T", 0), ("T", 1)]
    assert master.lock("G", "c2", [("T", 2)], now=130.0) == [("T", 2)]
    assert master.lock("H", "c3", [("U", 0)], now=10.0) == [("U", 0)]  # lapsed by 130
    version = master.version
    document = master.export(now=130.0)
    assert document == {"G": [["T", 0, "c1", 30.0], ["T", 1, "c1", 30.0], ["T", 2, "c2", 0.0]]}

    copy = QueueLocks(expiry_s=60)
    copy.replace_all(document, now=5000.0)
    assert copy.lock("G", "c2", [("T", 0)], now=5000.0) == []  # c1 still holds it
    assert copy.holder("G", ("T", 2), now=5059.0) == "c2"
    assert copy.holder("G", ("T", 0), now=5031.0) is None  # c1's lock lapses 30 s earlier
    assert copy.lock("G", "c2", [("T", 0)], now=5031.0) == [("T", 0)]
    master.unlock("G", "c1", [("T", 1)])
    assert master.version > version


def test_a_handed_message_keeps_everything_it_carries():
    m = Message(
        topic="T",
        queue_id=7,
        body=b"\x00body",
        properties={"KEYS": "k1 k2", "TAGS": "a"},
        flag=3,
        sys_flag=8,
        born_timestamp_ms=123,
        born_host=b"\x7f\x00\x00\x01\x00\x00\x1f\x90",
        reconsume_times=2,
    )
    wire = HandedMessage.FromString(to_handed(m).SerializeToString())
    assert from_handed(wire) == m


def test_an_escaped_message_lands_in_a_queue_the_receiver_has():
    stored: list[Message] = []

    async def put(messages: list[Message]) -> PutResult:
        stored.extend(messages)
        return PutResult(PutStatus.PUT_OK)

    service = ReplicaPeersService(
        "b",
        None,
        max_offset=lambda: 0,
        is_master=lambda: True,
        topic=lambda name: TopicConfig(name, write_queue_nums=4) if name == "T" else None,
        put=put,
        check_back=lambda *_: False,
    )
    sent = Message("T", 7, b"x", {"TAGS": "a"}, 0, 0, 123, b"\x00" * 20, 1)
    request = rpb.EscapeRequest(from_broker="a", messages=[to_handed(sent)])
    reply = asyncio.run(service.Escape(request, context=None))
    assert reply.status == "PUT_OK"
    assert stored == [Message("T", 3, b"x", {"TAGS": "a"}, 0, 0, 123, b"\x00" * 20, 1)]
    stray = rpb.EscapeRequest(from_broker="a", messages=[to_handed(Message("U", 0, b"y"))])
    reply = asyncio.run(service.Escape(stray, context=None))
    assert reply.status == "TOPIC_NOT_EXIST" and "'U'" in reply.detail
    assert len(stored) == 1


def test_peers_are_parsed_and_bad_combinations_refused():
    s = ReplicationSettings(
        role="slave",
        broker_id=1,
        master_address="127.0.0.1:1",
        peers="0@127.0.0.1:1, 1@127.0.0.1:2,2@host-c:3",
        slave_acting_master=True,
        escape_addresses="127.0.0.1:9, 127.0.0.1:10",
    )
    assert s.peer_addresses == {0: "127.0.0.1:1", 1: "127.0.0.1:2", 2: "host-c:3"}
    assert s.escape_address_list == ["127.0.0.1:9", "127.0.0.1:10"]
    for bad, match in [
        ({"peers": "127.0.0.1:1"}, "id@host:port"),
        ({"peers": "x@127.0.0.1:1"}, "id@host:port"),
        ({"peers": "0@127.0.0.1"}, "id@host:port"),
        ({"peers": "0@a:1,0@b:2"}, "twice"),
        ({"slave_acting_master": True}, "needs a master or slave role and peers"),
        ({"role": "standalone", "peers": "0@a:1", "slave_acting_master": True}, "role"),
        ({"controller_address": "c:1", "role": "standalone", "peers": "0@a:1"}, "without a"),
        ({"peer_timeout_ms": 0, "role": "master"}, "peer_timeout_ms"),
    ]:
        fields = {"role": "master"} | bad
        with pytest.raises(ValueError, match=match):
            ReplicationSettings(**fields)
