"""A slave whose copy of a record rots on disk (a flipped bit) mends it from the master:
found by its scrub or by a read, fetched again, written over, and said so in its metrics
and log. While the master cannot give a sound copy, the slave is out of the SyncStateSet
(it could not give that message back if it were elected), writes go on, and it rejoins
once the record is mended."""

from __future__ import annotations

import os
from pathlib import Path

from rocketmq.grpc_protocol import definition_pb2 as pb

from tests.broker.broker_process import BrokerProcess
from tests.broker.replication.test_controlled_group import (
    metric,
    send_code,
    start_cluster,
    stop_cluster,
)
from tests.broker.replication.test_replication_stream import bodies, scrape
from tests.broker.test_batch_pull import pull, puller
from tests.waiting import wait_until

BODY_AT = 112  # the first body byte of a record (format.RECORD_HEADER_BYTES)


def commit_log_offset(b: BrokerProcess, offset: int) -> int:
    """Where `b`'s own copy of queue 0's message `offset` of topic T starts."""
    [m] = pull(puller(b.address, here=True), offset, 1).messages
    return m.commit_log_offset


def flip_bit(b: BrokerProcess, phys: int, at: int = BODY_AT) -> None:
    """Flip one bit `at` bytes into the record at `phys` in `b`'s CommitLog files (the
    broker reads them with pread, so a running one sees it at once)."""
    segments = sorted((b.root / "data" / "store" / "commitlog").iterdir())
    path = [p for p in segments if int(p.name) <= phys][-1]
    fd = os.open(path, os.O_RDWR)
    try:
        where = phys - int(path.name) + at
        os.pwrite(fd, bytes([os.pread(fd, 1, where)[0] ^ 0x04]), where)
    finally:
        os.close(fd)


def gauge(b: BrokerProcess, name: str) -> float:
    return metric(scrape(b), name)


def send_all(b: BrokerProcess, count: int, prefix: str) -> list[bytes]:
    sent = [f"{prefix}-{i:04d}".encode() for i in range(count)]
    for body in sent:
        assert send_code(b, body) == pb.OK
    return sent


def test_the_scrub_finds_a_flipped_bit_on_a_slave_and_mends_it_from_the_master(
    tmp_path: Path,
) -> None:
    cluster = start_cluster(tmp_path, scrub_bytes_per_s=8 * 1024 * 1024)
    try:
        master, slave = cluster.ready(queues=1)
        sent = send_all(master, 300, "m")
        wait_until(lambda: bodies(slave, "T", 1, here=True) == sent, 10, "the slave's copy")
        damaged = commit_log_offset(slave, 17)
        # Stopped cleanly, the slave's restart checks nothing below its checkpoint: only
        # the scrub can find this one.
        assert slave.stop() == 0
        flip_bit(slave, damaged)
        slave.start()
        wait_until(
            lambda: gauge(slave, "capstan_replica_healed_records_total") == 1,
            20,
            "the slave to mend the record",
        )
        assert gauge(slave, "capstan_replica_damaged_records") == 0
        assert gauge(slave, "capstan_replica_scrubbed_bytes_total") >= damaged
        assert bodies(slave, "T", 1, here=True) == sent
        log = slave.log.read_text()
        assert f"the record at CommitLog offset {damaged} fails its checks" in log
        assert f"mended the record at CommitLog offset {damaged}" in log
        wait_until(lambda: cluster.settled(2), 20, "the slave in the SyncStateSet")
    finally:
        stop_cluster(cluster)


def test_a_slave_that_cannot_mend_a_record_leaves_the_sync_state_set_until_it_can(
    tmp_path: Path,
) -> None:
    cluster = start_cluster(tmp_path, scrub_bytes_per_s=0)  # reads find it here
    try:
        master, slave = cluster.ready(queues=1)
        sent = send_all(master, 50, "m")
        wait_until(lambda: bodies(slave, "T", 1, here=True) == sent, 10, "the slave's copy")
        damaged = commit_log_offset(master, 9)
        assert commit_log_offset(slave, 9) == damaged  # the same bytes at the same offsets
        flip_bit(master, damaged)  # the master's copy too: nobody has a sound one
        flip_bit(slave, damaged)
        assert len(bodies(slave, "T", 1, here=True)) == 49  # the read meets it

        wait_until(
            lambda: list(cluster.info().sync_state_set) == [cluster.info().master_id],
            10,
            "the damaged slave out of the SyncStateSet",
        )
        assert gauge(slave, "capstan_replica_damaged_records") == 1
        assert gauge(slave, "capstan_replica_healed_records_total") == 0
        assert "this master's copy too" in slave.log.read_text()
        more = send_all(master, 20, "n")  # writes go on without it

        flip_bit(master, damaged)  # the master's copy back as it was
        wait_until(
            lambda: gauge(slave, "capstan_replica_healed_records_total") == 1,
            20,
            "the slave to mend the record",
        )
        wait_until(lambda: cluster.settled(2), 20, "the slave back in the SyncStateSet")
        assert gauge(slave, "capstan_replica_damaged_records") == 0
        assert bodies(slave, "T", 1, here=True) == sent + more
    finally:
        stop_cluster(cluster)
