from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BrokerReplica(_message.Message):
    __slots__ = ("broker_id", "address", "alive", "epoch", "max_offset", "seconds_since_heartbeat", "pid", "zone")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SINCE_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    address: str
    alive: bool
    epoch: int
    max_offset: int
    seconds_since_heartbeat: float
    pid: int
    zone: str
    def __init__(self, broker_id: _Optional[int] = ..., address: _Optional[str] = ..., alive: _Optional[bool] = ..., epoch: _Optional[int] = ..., max_offset: _Optional[int] = ..., seconds_since_heartbeat: _Optional[float] = ..., pid: _Optional[int] = ..., zone: _Optional[str] = ...) -> None: ...

class ReplicaInfo(_message.Message):
    __slots__ = ("group", "master_id", "master_address", "master_epoch", "sync_state_set", "sync_state_set_epoch", "replicas")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MASTER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    group: str
    master_id: int
    master_address: str
    master_epoch: int
    sync_state_set: _containers.RepeatedScalarFieldContainer[int]
    sync_state_set_epoch: int
    replicas: _containers.RepeatedCompositeFieldContainer[BrokerReplica]
    def __init__(self, group: _Optional[str] = ..., master_id: _Optional[int] = ..., master_address: _Optional[str] = ..., master_epoch: _Optional[int] = ..., sync_state_set: _Optional[_Iterable[int]] = ..., sync_state_set_epoch: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[BrokerReplica, _Mapping]]] = ...) -> None: ...

class RegisterBrokerRequest(_message.Message):
    __slots__ = ("group", "address", "identity", "epoch", "max_offset", "pid", "leading", "zone")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    LEADING_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    group: str
    address: str
    identity: str
    epoch: int
    max_offset: int
    pid: int
    leading: bool
    zone: str
    def __init__(self, group: _Optional[str] = ..., address: _Optional[str] = ..., identity: _Optional[str] = ..., epoch: _Optional[int] = ..., max_offset: _Optional[int] = ..., pid: _Optional[int] = ..., leading: _Optional[bool] = ..., zone: _Optional[str] = ...) -> None: ...

class RegisterBrokerReply(_message.Message):
    __slots__ = ("broker_id", "info")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    info: ReplicaInfo
    def __init__(self, broker_id: _Optional[int] = ..., info: _Optional[_Union[ReplicaInfo, _Mapping]] = ...) -> None: ...

class BrokerHeartbeatRequest(_message.Message):
    __slots__ = ("group", "broker_id", "address", "epoch", "max_offset", "pid", "leading", "zone", "master_lost_epoch", "ack_quorum", "final_at_epoch")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    LEADING_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    MASTER_LOST_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ACK_QUORUM_FIELD_NUMBER: _ClassVar[int]
    FINAL_AT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    group: str
    broker_id: int
    address: str
    epoch: int
    max_offset: int
    pid: int
    leading: bool
    zone: str
    master_lost_epoch: int
    ack_quorum: int
    final_at_epoch: int
    def __init__(self, group: _Optional[str] = ..., broker_id: _Optional[int] = ..., address: _Optional[str] = ..., epoch: _Optional[int] = ..., max_offset: _Optional[int] = ..., pid: _Optional[int] = ..., leading: _Optional[bool] = ..., zone: _Optional[str] = ..., master_lost_epoch: _Optional[int] = ..., ack_quorum: _Optional[int] = ..., final_at_epoch: _Optional[int] = ...) -> None: ...

class BrokerHeartbeatReply(_message.Message):
    __slots__ = ("info",)
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: ReplicaInfo
    def __init__(self, info: _Optional[_Union[ReplicaInfo, _Mapping]] = ...) -> None: ...

class GetReplicaInfoRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class AlterSyncStateSetRequest(_message.Message):
    __slots__ = ("group", "proposer_id", "master_epoch", "sync_state_set_epoch", "new_sync_state_set")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PROPOSER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NEW_SYNC_STATE_SET_FIELD_NUMBER: _ClassVar[int]
    group: str
    proposer_id: int
    master_epoch: int
    sync_state_set_epoch: int
    new_sync_state_set: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, group: _Optional[str] = ..., proposer_id: _Optional[int] = ..., master_epoch: _Optional[int] = ..., sync_state_set_epoch: _Optional[int] = ..., new_sync_state_set: _Optional[_Iterable[int]] = ...) -> None: ...

class AlterSyncStateSetReply(_message.Message):
    __slots__ = ("accepted", "reason", "info")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    info: ReplicaInfo
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., info: _Optional[_Union[ReplicaInfo, _Mapping]] = ...) -> None: ...

class ElectMasterRequest(_message.Message):
    __slots__ = ("group", "preferred_broker_id", "handing_over_from")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    HANDING_OVER_FROM_FIELD_NUMBER: _ClassVar[int]
    group: str
    preferred_broker_id: int
    handing_over_from: int
    def __init__(self, group: _Optional[str] = ..., preferred_broker_id: _Optional[int] = ..., handing_over_from: _Optional[int] = ...) -> None: ...

class ElectMasterReply(_message.Message):
    __slots__ = ("changed", "reason", "info")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    reason: str
    info: ReplicaInfo
    def __init__(self, changed: _Optional[bool] = ..., reason: _Optional[str] = ..., info: _Optional[_Union[ReplicaInfo, _Mapping]] = ...) -> None: ...

class GetClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterStatus(_message.Message):
    __slots__ = ("groups", "controller_id", "leader", "unclean_election")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    UNCLEAN_ELECTION_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[ReplicaInfo]
    controller_id: str
    leader: bool
    unclean_election: bool
    def __init__(self, groups: _Optional[_Iterable[_Union[ReplicaInfo, _Mapping]]] = ..., controller_id: _Optional[str] = ..., leader: _Optional[bool] = ..., unclean_election: _Optional[bool] = ...) -> None: ...
