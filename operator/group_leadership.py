"""The operator's questions to its namespace's controller, in its own words: a group's
replicas and SyncStateSet, and moving its leadership to a chosen replica (the roller's and
the scale-down's SWITCH_MASTER step). The SDK's controller client does the calling and
follows the leading controller."""

from __future__ import annotations

from capstan.client.admin import ControllerClient
from capstan.client.errors import NotFound, NotReady
from capstan.v1 import controller_pb2 as pb


async def replicas(controller: ControllerClient, group: str) -> pb.ReplicaInfo | None:
    """The group's replicas as the controller knows them; None before any registered."""
    try:
        info: pb.ReplicaInfo = await controller.replica_info(group)
    except NotFound:
        return None
    return info


async def switch_master(controller: ControllerClient, group: str, broker_id: int) -> pb.ReplicaInfo:
    """Ask for `broker_id` as the group's master; the answer's epoch confirms it. NotReady
    when the controller keeps another (say, the broker is not in sync)."""
    reply: pb.ElectMasterReply = await controller.elect_master(group, broker_id)
    if reply.info.master_id != broker_id:
        raise NotReady(f"the controller kept master {reply.info.master_id}: {reply.reason}")
    info: pb.ReplicaInfo = reply.info
    return info
