"""Static topics' queue mappings on the wire (capstan.v1 QueueMapping) and back.

The mapping itself, and every rule it keeps, is capstan/common/queue_mapping.py; reading one
off the wire checks those rules, so a malformed mapping from anyone is a MappingError that
names what is wrong.
"""

from __future__ import annotations

from capstan.common.queue_mapping import MappingItem, QueueMapping
from capstan.v1 import admin_pb2 as pb


def mapping_to_wire(mapping: QueueMapping) -> pb.QueueMapping:
    return pb.QueueMapping(
        topic=mapping.topic,
        epoch=mapping.epoch,
        queues=[
            pb.LogicQueue(
                items=[
                    pb.MappingItem(
                        gen=i.gen,
                        group=i.group,
                        queue_id=i.queue_id,
                        logic_offset=i.logic_offset,
                        start_offset=i.start_offset,
                        end_offset=i.end_offset,
                    )
                    for i in items
                ]
            )
            for items in mapping.queues
        ],
    )


def mapping_from_wire(wire: pb.QueueMapping) -> QueueMapping:
    """The mapping `wire` describes; MappingError when it breaks a rule."""
    return QueueMapping(
        wire.topic,
        wire.epoch,
        tuple(
            tuple(
                MappingItem(
                    i.gen, i.group, i.queue_id, i.logic_offset, i.start_offset, i.end_offset
                )
                for i in queue.items
            )
            for queue in wire.queues
        ),
    )
