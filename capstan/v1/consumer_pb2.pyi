from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MessageModel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MESSAGE_MODEL_UNSPECIFIED: _ClassVar[MessageModel]
    CLUSTERING: _ClassVar[MessageModel]
    BROADCASTING: _ClassVar[MessageModel]

class ConsumeType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONSUME_TYPE_UNSPECIFIED: _ClassVar[ConsumeType]
    PUSH: _ClassVar[ConsumeType]
    LITE_PULL: _ClassVar[ConsumeType]
MESSAGE_MODEL_UNSPECIFIED: MessageModel
CLUSTERING: MessageModel
BROADCASTING: MessageModel
CONSUME_TYPE_UNSPECIFIED: ConsumeType
PUSH: ConsumeType
LITE_PULL: ConsumeType

class Subscription(_message.Message):
    __slots__ = ("topic", "expression")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    expression: str
    def __init__(self, topic: _Optional[str] = ..., expression: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("client_id", "group", "message_model", "consume_type", "orderly", "subscriptions", "owned")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_MODEL_FIELD_NUMBER: _ClassVar[int]
    CONSUME_TYPE_FIELD_NUMBER: _ClassVar[int]
    ORDERLY_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    OWNED_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    group: str
    message_model: MessageModel
    consume_type: ConsumeType
    orderly: bool
    subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    owned: _containers.RepeatedCompositeFieldContainer[QueueRef]
    def __init__(self, client_id: _Optional[str] = ..., group: _Optional[str] = ..., message_model: _Optional[_Union[MessageModel, str]] = ..., consume_type: _Optional[_Union[ConsumeType, str]] = ..., orderly: _Optional[bool] = ..., subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ..., owned: _Optional[_Iterable[_Union[QueueRef, _Mapping]]] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("members_version",)
    MEMBERS_VERSION_FIELD_NUMBER: _ClassVar[int]
    members_version: int
    def __init__(self, members_version: _Optional[int] = ...) -> None: ...

class WatchGroupRequest(_message.Message):
    __slots__ = ("client_id", "group")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    group: str
    def __init__(self, client_id: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("client_id", "message_model", "consume_type", "orderly", "subscriptions", "seconds_since_heartbeat", "owned")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_MODEL_FIELD_NUMBER: _ClassVar[int]
    CONSUME_TYPE_FIELD_NUMBER: _ClassVar[int]
    ORDERLY_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SINCE_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    OWNED_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    message_model: MessageModel
    consume_type: ConsumeType
    orderly: bool
    subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    seconds_since_heartbeat: float
    owned: _containers.RepeatedCompositeFieldContainer[QueueRef]
    def __init__(self, client_id: _Optional[str] = ..., message_model: _Optional[_Union[MessageModel, str]] = ..., consume_type: _Optional[_Union[ConsumeType, str]] = ..., orderly: _Optional[bool] = ..., subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ..., seconds_since_heartbeat: _Optional[float] = ..., owned: _Optional[_Iterable[_Union[QueueRef, _Mapping]]] = ...) -> None: ...

class GroupMembers(_message.Message):
    __slots__ = ("group", "members_version", "members", "subscriptions_consistent", "inconsistency", "offset_reset")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_VERSION_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_CONSISTENT_FIELD_NUMBER: _ClassVar[int]
    INCONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_RESET_FIELD_NUMBER: _ClassVar[int]
    group: str
    members_version: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    subscriptions_consistent: bool
    inconsistency: str
    offset_reset: OffsetReset
    def __init__(self, group: _Optional[str] = ..., members_version: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., subscriptions_consistent: _Optional[bool] = ..., inconsistency: _Optional[str] = ..., offset_reset: _Optional[_Union[OffsetReset, _Mapping]] = ...) -> None: ...

class OffsetReset(_message.Message):
    __slots__ = ("reset_id", "offsets")
    RESET_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    reset_id: int
    offsets: _containers.RepeatedCompositeFieldContainer[QueueOffset]
    def __init__(self, reset_id: _Optional[int] = ..., offsets: _Optional[_Iterable[_Union[QueueOffset, _Mapping]]] = ...) -> None: ...

class UnregisterRequest(_message.Message):
    __slots__ = ("client_id", "group")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    group: str
    def __init__(self, client_id: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class UnregisterReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetMembersRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class QueueRef(_message.Message):
    __slots__ = ("topic", "queue_id", "broker_name")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    broker_name: str
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., broker_name: _Optional[str] = ...) -> None: ...

class LockQueuesRequest(_message.Message):
    __slots__ = ("client_id", "group", "queues")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    group: str
    queues: _containers.RepeatedCompositeFieldContainer[QueueRef]
    def __init__(self, client_id: _Optional[str] = ..., group: _Optional[str] = ..., queues: _Optional[_Iterable[_Union[QueueRef, _Mapping]]] = ...) -> None: ...

class LockQueuesReply(_message.Message):
    __slots__ = ("locked", "expiry_ms")
    LOCKED_FIELD_NUMBER: _ClassVar[int]
    EXPIRY_MS_FIELD_NUMBER: _ClassVar[int]
    locked: _containers.RepeatedCompositeFieldContainer[QueueRef]
    expiry_ms: int
    def __init__(self, locked: _Optional[_Iterable[_Union[QueueRef, _Mapping]]] = ..., expiry_ms: _Optional[int] = ...) -> None: ...

class UnlockQueuesRequest(_message.Message):
    __slots__ = ("client_id", "group", "queues")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    group: str
    queues: _containers.RepeatedCompositeFieldContainer[QueueRef]
    def __init__(self, client_id: _Optional[str] = ..., group: _Optional[str] = ..., queues: _Optional[_Iterable[_Union[QueueRef, _Mapping]]] = ...) -> None: ...

class UnlockQueuesReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QueueOffset(_message.Message):
    __slots__ = ("topic", "queue_id", "offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    offset: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class CommitOffsetsRequest(_message.Message):
    __slots__ = ("group", "offsets")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    group: str
    offsets: _containers.RepeatedCompositeFieldContainer[QueueOffset]
    def __init__(self, group: _Optional[str] = ..., offsets: _Optional[_Iterable[_Union[QueueOffset, _Mapping]]] = ...) -> None: ...

class CommitOffsetsReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QueryOffsetRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ...) -> None: ...

class QueryOffsetReply(_message.Message):
    __slots__ = ("found", "offset")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    found: bool
    offset: int
    def __init__(self, found: _Optional[bool] = ..., offset: _Optional[int] = ...) -> None: ...

class SearchOffsetRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "timestamp_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    timestamp_ms: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class SearchOffsetReply(_message.Message):
    __slots__ = ("offset",)
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    offset: int
    def __init__(self, offset: _Optional[int] = ...) -> None: ...

class GetQueueBoundsRequest(_message.Message):
    __slots__ = ("topic", "queue_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ...) -> None: ...

class GetQueueBoundsReply(_message.Message):
    __slots__ = ("min_offset", "max_offset")
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    min_offset: int
    max_offset: int
    def __init__(self, min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ...) -> None: ...

class SendBackRequest(_message.Message):
    __slots__ = ("group", "commit_log_offset", "delay_level", "max_reconsume_times")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    COMMIT_LOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DELAY_LEVEL_FIELD_NUMBER: _ClassVar[int]
    MAX_RECONSUME_TIMES_FIELD_NUMBER: _ClassVar[int]
    group: str
    commit_log_offset: int
    delay_level: int
    max_reconsume_times: int
    def __init__(self, group: _Optional[str] = ..., commit_log_offset: _Optional[int] = ..., delay_level: _Optional[int] = ..., max_reconsume_times: _Optional[int] = ...) -> None: ...

class SendBackReply(_message.Message):
    __slots__ = ("topic", "reconsume_times", "deliver_at_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECONSUME_TIMES_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    reconsume_times: int
    deliver_at_ms: int
    def __init__(self, topic: _Optional[str] = ..., reconsume_times: _Optional[int] = ..., deliver_at_ms: _Optional[int] = ...) -> None: ...
