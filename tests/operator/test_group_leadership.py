"""The roller's master switch (operator/group_leadership.py) against a real controller
and a real broker pair."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.client.admin import ControllerClient
from capstan.client.errors import NotReady, TransportError
from capstan.operator.group_leadership import replicas, switch_master
from tests.broker.replication.test_controlled_group import (
    GROUP,
    send_code,
    start_cluster,
    stop_cluster,
)
from tests.waiting import wait_until


def test_switching_the_master_to_the_in_sync_slave_bumps_the_epoch(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path)
    try:
        cluster.ready()  # in sync, with topic T
        before = cluster.info()
        slave_id = next(r.broker_id for r in before.replicas if r.broker_id != before.master_id)

        async def scenario() -> None:
            controller = ControllerClient(f"127.0.0.1:{cluster.controller.port}")
            try:
                info = await replicas(controller, GROUP)
                assert info is not None and info.master_id == before.master_id
                assert await replicas(controller, "no-such-group") is None
                after = await switch_master(controller, GROUP, slave_id)
                assert after.master_id == slave_id
                assert after.master_epoch == before.master_epoch + 1
                with pytest.raises(NotReady):
                    await switch_master(controller, GROUP, 99)
            finally:
                await controller.close()

        asyncio.run(scenario())
        # The brokers follow: the old slave leads and takes writes.
        new_master = cluster.by_id(slave_id)
        wait_until(
            lambda: send_code(new_master, b"after") == pb.OK, 10, "a write on the new master"
        )
    finally:
        stop_cluster(cluster)


def test_an_absent_controller_is_a_temporary_error() -> None:
    async def scenario() -> None:
        controller = ControllerClient("127.0.0.1:1", retry_s=0)
        try:
            with pytest.raises(TransportError) as failed:
                await replicas(controller, GROUP)
            assert failed.value.retriable
        finally:
            await controller.close()

    asyncio.run(scenario())
