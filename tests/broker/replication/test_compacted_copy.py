"""A replica that missed a compaction takes the master's compacted copy through
replication (Replication/FetchCompacted), so a failover to it keeps every kept record:
here only the master is compacted, the slave fetches the copy, and after the master's
kill -9 the promoted slave serves exactly the latest value per key below the cut. The job's
own manifest reaching the slave late finds that copy and swaps nothing."""

from __future__ import annotations

from pathlib import Path

from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.common.compaction_manifest import KeptRecord, QueueCut, write_manifest
from capstan.spark.capstan_source import Replica
from capstan.spark.compaction import send_manifest
from capstan.v1 import admin_pb2 as apb
from capstan.v1 import pull_pb2 as ppb
from capstan.v1 import pull_pb2_grpc as ppb_grpc
from tests.broker.broker_process import BrokerProcess, open_channel
from tests.broker.replication.test_controlled_group import GROUP, start_cluster, stop_cluster
from tests.broker.v2_requests import send_to_queue, stub, v2_message
from tests.waiting import wait_until


def read_here(b: BrokerProcess, topic: str) -> list[tuple[int, str, bytes, int]]:
    """(offset, KEYS, body, body CRC) of queue 0 of `topic` as `b` itself holds it."""
    pull = ppb_grpc.PullStub(open_channel(b.address, here=True))
    found, offset = [], 0
    while True:
        reply = pull.PullMessages(
            ppb.PullMessagesRequest(topic=topic, queue_id=0, offset=offset, max_messages=64),
            timeout=10,
        )
        found += [
            (m.queue_offset, m.properties["KEYS"], m.body, m.body_crc) for m in reply.messages
        ]
        if reply.next_begin_offset <= offset or reply.status == ppb.NO_NEW_MSG:
            return found
        offset = reply.next_begin_offset


def test_a_slave_takes_the_masters_compacted_copy_and_keeps_it_through_a_failover(
    tmp_path: Path,
):
    cluster = start_cluster(tmp_path)
    try:
        master, slave = cluster.ready()
        master.admin().CreateTopic(
            apb.Topic(
                name="P",
                read_queue_nums=1,
                write_queue_nums=1,
                attributes={"cleanup.policy": "COMPACT"},
            ),
            timeout=10,
        )
        wait_until(
            lambda: slave.queue_ends_once_made("P", here=True) == [0], 10, "the topic on the slave"
        )
        s = stub(master.address)
        for i in range(100):
            m = v2_message("P", f"v{i}".encode(), keys=[f"k{i % 10}"])
            reply, _ = send_to_queue(s, "0", m)
            assert reply.status.code == pb.OK, reply
        records = read_here(master, "P")
        latest = {key: (offset, key, body, crc) for offset, key, body, crc in records}
        kept = [KeptRecord(0, o, k, c) for o, k, _, c in sorted(latest.values())]
        manifest = write_manifest(tmp_path / "m", "P", [QueueCut(0, 100)], kept)
        # Only the master is compacted, as if the slave had been down during the job.
        result = send_manifest(Replica(GROUP, master.address, True), manifest, "test", print)
        assert not result.error and result.generation == 1, result
        expected = sorted(latest.values())
        assert read_here(master, "P") == expected

        wait_until(lambda: read_here(slave, "P") == expected, 20, "the copy on the slave")
        assert "took the master's compacted copy of P" in slave.log.read_text()
        # The job's manifest reaching the slave after that finds its own copy there.
        late = send_manifest(Replica(GROUP, slave.address, False), manifest, "test", print)
        assert not late.error and (late.generation, late.kept) == (1, len(kept)), late
        assert "already holds job test's copy (generation 1)" in slave.log.read_text()
        assert read_here(slave, "P") == expected

        master.kill9()
        wait_until(lambda: cluster.master() is slave, 30, "the slave promoted")
        assert read_here(slave, "P") == expected
        assert [body for _, _, body, _ in expected] == [f"v{i}".encode() for i in range(90, 100)]
    finally:
        stop_cluster(cluster)
