from capstan.v1 import consumer_pb2 as _consumer_pb2
from capstan.v1 import handed_message_pb2 as _handed_message_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TopicType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOPIC_TYPE_UNSPECIFIED: _ClassVar[TopicType]
    NORMAL: _ClassVar[TopicType]
    FIFO: _ClassVar[TopicType]
    DELAY: _ClassVar[TopicType]
    TRANSACTION: _ClassVar[TopicType]
    MIXED: _ClassVar[TopicType]
TOPIC_TYPE_UNSPECIFIED: TopicType
NORMAL: TopicType
FIFO: TopicType
DELAY: TopicType
TRANSACTION: TopicType
MIXED: TopicType

class Topic(_message.Message):
    __slots__ = ("name", "type", "read_queue_nums", "write_queue_nums", "perm", "attributes")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    READ_QUEUE_NUMS_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUEUE_NUMS_FIELD_NUMBER: _ClassVar[int]
    PERM_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: TopicType
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    attributes: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., type: _Optional[_Union[TopicType, str]] = ..., read_queue_nums: _Optional[int] = ..., write_queue_nums: _Optional[int] = ..., perm: _Optional[int] = ..., attributes: _Optional[_Mapping[str, str]] = ...) -> None: ...

class QueueStatus(_message.Message):
    __slots__ = ("queue_id", "min_offset", "max_offset", "last_store_timestamp_ms", "broker")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_STORE_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    BROKER_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    min_offset: int
    max_offset: int
    last_store_timestamp_ms: int
    broker: str
    def __init__(self, queue_id: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., last_store_timestamp_ms: _Optional[int] = ..., broker: _Optional[str] = ...) -> None: ...

class TopicStatus(_message.Message):
    __slots__ = ("topic", "queues", "system", "brokers")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    topic: Topic
    queues: _containers.RepeatedCompositeFieldContainer[QueueStatus]
    system: bool
    brokers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topic: _Optional[_Union[Topic, _Mapping]] = ..., queues: _Optional[_Iterable[_Union[QueueStatus, _Mapping]]] = ..., system: _Optional[bool] = ..., brokers: _Optional[_Iterable[str]] = ...) -> None: ...

class TopicRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class TopicReply(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: TopicStatus
    def __init__(self, topic: _Optional[_Union[TopicStatus, _Mapping]] = ...) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ("include_system",)
    INCLUDE_SYSTEM_FIELD_NUMBER: _ClassVar[int]
    include_system: bool
    def __init__(self, include_system: _Optional[bool] = ...) -> None: ...

class ListTopicsReply(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicStatus]
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicStatus, _Mapping]]] = ...) -> None: ...

class DeleteReply(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class Group(_message.Message):
    __slots__ = ("name", "fifo", "max_attempts", "consume_enable")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FIFO_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    CONSUME_ENABLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    fifo: bool
    max_attempts: int
    consume_enable: bool
    def __init__(self, name: _Optional[str] = ..., fifo: _Optional[bool] = ..., max_attempts: _Optional[int] = ..., consume_enable: _Optional[bool] = ...) -> None: ...

class GroupQueueOffset(_message.Message):
    __slots__ = ("topic", "queue_id", "committed_offset", "max_offset", "lag", "inflight", "broker")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    BROKER_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    committed_offset: int
    max_offset: int
    lag: int
    inflight: int
    broker: str
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., committed_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., lag: _Optional[int] = ..., inflight: _Optional[int] = ..., broker: _Optional[str] = ...) -> None: ...

class GroupClient(_message.Message):
    __slots__ = ("client_id", "client_type", "topics", "seconds_since_seen")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SINCE_SEEN_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    client_type: str
    topics: _containers.RepeatedScalarFieldContainer[str]
    seconds_since_seen: float
    def __init__(self, client_id: _Optional[str] = ..., client_type: _Optional[str] = ..., topics: _Optional[_Iterable[str]] = ..., seconds_since_seen: _Optional[float] = ...) -> None: ...

class GroupStatus(_message.Message):
    __slots__ = ("group", "offsets", "clients", "total_lag", "members", "brokers")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_LAG_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    group: Group
    offsets: _containers.RepeatedCompositeFieldContainer[GroupQueueOffset]
    clients: _containers.RepeatedCompositeFieldContainer[GroupClient]
    total_lag: int
    members: _consumer_pb2.GroupMembers
    brokers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group: _Optional[_Union[Group, _Mapping]] = ..., offsets: _Optional[_Iterable[_Union[GroupQueueOffset, _Mapping]]] = ..., clients: _Optional[_Iterable[_Union[GroupClient, _Mapping]]] = ..., total_lag: _Optional[int] = ..., members: _Optional[_Union[_consumer_pb2.GroupMembers, _Mapping]] = ..., brokers: _Optional[_Iterable[str]] = ...) -> None: ...

class GroupRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GroupReply(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: GroupStatus
    def __init__(self, group: _Optional[_Union[GroupStatus, _Mapping]] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListGroupsReply(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupStatus]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupStatus, _Mapping]]] = ...) -> None: ...

class ResetOffsetRequest(_message.Message):
    __slots__ = ("group", "topic", "earliest", "latest", "timestamp_ms")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    EARLIEST_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    earliest: bool
    latest: bool
    timestamp_ms: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., earliest: _Optional[bool] = ..., latest: _Optional[bool] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class ResetOffsetReply(_message.Message):
    __slots__ = ("offsets",)
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.RepeatedCompositeFieldContainer[GroupQueueOffset]
    def __init__(self, offsets: _Optional[_Iterable[_Union[GroupQueueOffset, _Mapping]]] = ...) -> None: ...

class StoredMessage(_message.Message):
    __slots__ = ("topic", "queue_id", "queue_offset", "message_id", "offset_message_id", "tag", "keys", "properties", "body", "born_timestamp_ms", "store_timestamp_ms", "reconsume_times", "commitlog_offset", "broker")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    BORN_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    STORE_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    RECONSUME_TIMES_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BROKER_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    queue_offset: int
    message_id: str
    offset_message_id: str
    tag: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    properties: _containers.ScalarMap[str, str]
    body: bytes
    born_timestamp_ms: int
    store_timestamp_ms: int
    reconsume_times: int
    commitlog_offset: int
    broker: str
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., message_id: _Optional[str] = ..., offset_message_id: _Optional[str] = ..., tag: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., properties: _Optional[_Mapping[str, str]] = ..., body: _Optional[bytes] = ..., born_timestamp_ms: _Optional[int] = ..., store_timestamp_ms: _Optional[int] = ..., reconsume_times: _Optional[int] = ..., commitlog_offset: _Optional[int] = ..., broker: _Optional[str] = ...) -> None: ...

class GetMessageRequest(_message.Message):
    __slots__ = ("topic", "message_id", "key", "max_results")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_RESULTS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    message_id: str
    key: str
    max_results: int
    def __init__(self, topic: _Optional[str] = ..., message_id: _Optional[str] = ..., key: _Optional[str] = ..., max_results: _Optional[int] = ...) -> None: ...

class GetMessageReply(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[StoredMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[StoredMessage, _Mapping]]] = ...) -> None: ...

class DescribeBrokerRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HandOverRequest(_message.Message):
    __slots__ = ("successor_broker_id",)
    SUCCESSOR_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    successor_broker_id: int
    def __init__(self, successor_broker_id: _Optional[int] = ...) -> None: ...

class HandOverReply(_message.Message):
    __slots__ = ("changed", "reason")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    reason: str
    def __init__(self, changed: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class BrokerBacklog(_message.Message):
    __slots__ = ("broker_name", "master", "unconsumed", "half_messages", "timers_waiting")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    MASTER_FIELD_NUMBER: _ClassVar[int]
    UNCONSUMED_FIELD_NUMBER: _ClassVar[int]
    HALF_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TIMERS_WAITING_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    master: bool
    unconsumed: int
    half_messages: int
    timers_waiting: int
    def __init__(self, broker_name: _Optional[str] = ..., master: _Optional[bool] = ..., unconsumed: _Optional[int] = ..., half_messages: _Optional[int] = ..., timers_waiting: _Optional[int] = ...) -> None: ...

class CompactionCut(_message.Message):
    __slots__ = ("queue_id", "boundary")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    BOUNDARY_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    boundary: int
    def __init__(self, queue_id: _Optional[int] = ..., boundary: _Optional[int] = ...) -> None: ...

class CompactionHeader(_message.Message):
    __slots__ = ("topic", "cuts", "job")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CUTS_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    topic: str
    cuts: _containers.RepeatedCompositeFieldContainer[CompactionCut]
    job: str
    def __init__(self, topic: _Optional[str] = ..., cuts: _Optional[_Iterable[_Union[CompactionCut, _Mapping]]] = ..., job: _Optional[str] = ...) -> None: ...

class CompactionKept(_message.Message):
    __slots__ = ("queue_id", "queue_offset", "key", "body_crc")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    BODY_CRC_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    queue_offset: int
    key: str
    body_crc: int
    def __init__(self, queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., key: _Optional[str] = ..., body_crc: _Optional[int] = ...) -> None: ...

class CompactionKeptBatch(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[CompactionKept]
    def __init__(self, records: _Optional[_Iterable[_Union[CompactionKept, _Mapping]]] = ...) -> None: ...

class CompactionTrailer(_message.Message):
    __slots__ = ("sha256", "record_count")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    RECORD_COUNT_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    record_count: int
    def __init__(self, sha256: _Optional[str] = ..., record_count: _Optional[int] = ...) -> None: ...

class CompactionChunk(_message.Message):
    __slots__ = ("header", "kept", "trailer")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    TRAILER_FIELD_NUMBER: _ClassVar[int]
    header: CompactionHeader
    kept: CompactionKeptBatch
    trailer: CompactionTrailer
    def __init__(self, header: _Optional[_Union[CompactionHeader, _Mapping]] = ..., kept: _Optional[_Union[CompactionKeptBatch, _Mapping]] = ..., trailer: _Optional[_Union[CompactionTrailer, _Mapping]] = ...) -> None: ...

class CompactedQueue(_message.Message):
    __slots__ = ("queue_id", "boundary", "kept", "dropped", "bytes")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    BOUNDARY_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    boundary: int
    kept: int
    dropped: int
    bytes: int
    def __init__(self, queue_id: _Optional[int] = ..., boundary: _Optional[int] = ..., kept: _Optional[int] = ..., dropped: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class CompactionReply(_message.Message):
    __slots__ = ("generation", "queues", "commitlog_bytes_freed")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_BYTES_FREED_FIELD_NUMBER: _ClassVar[int]
    generation: int
    queues: _containers.RepeatedCompositeFieldContainer[CompactedQueue]
    commitlog_bytes_freed: int
    def __init__(self, generation: _Optional[int] = ..., queues: _Optional[_Iterable[_Union[CompactedQueue, _Mapping]]] = ..., commitlog_bytes_freed: _Optional[int] = ...) -> None: ...

class PolicyEntry(_message.Message):
    __slots__ = ("resources", "actions", "decision", "source_ips")
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_IPS_FIELD_NUMBER: _ClassVar[int]
    resources: _containers.RepeatedScalarFieldContainer[str]
    actions: _containers.RepeatedScalarFieldContainer[str]
    decision: str
    source_ips: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, resources: _Optional[_Iterable[str]] = ..., actions: _Optional[_Iterable[str]] = ..., decision: _Optional[str] = ..., source_ips: _Optional[_Iterable[str]] = ...) -> None: ...

class User(_message.Message):
    __slots__ = ("username", "secret_key", "user_type", "user_status", "policy", "replace_policy")
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    SECRET_KEY_FIELD_NUMBER: _ClassVar[int]
    USER_TYPE_FIELD_NUMBER: _ClassVar[int]
    USER_STATUS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    REPLACE_POLICY_FIELD_NUMBER: _ClassVar[int]
    username: str
    secret_key: str
    user_type: str
    user_status: str
    policy: _containers.RepeatedCompositeFieldContainer[PolicyEntry]
    replace_policy: bool
    def __init__(self, username: _Optional[str] = ..., secret_key: _Optional[str] = ..., user_type: _Optional[str] = ..., user_status: _Optional[str] = ..., policy: _Optional[_Iterable[_Union[PolicyEntry, _Mapping]]] = ..., replace_policy: _Optional[bool] = ...) -> None: ...

class UserRequest(_message.Message):
    __slots__ = ("username",)
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    username: str
    def __init__(self, username: _Optional[str] = ...) -> None: ...

class UserReply(_message.Message):
    __slots__ = ("user",)
    USER_FIELD_NUMBER: _ClassVar[int]
    user: User
    def __init__(self, user: _Optional[_Union[User, _Mapping]] = ...) -> None: ...

class ListUsersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListUsersReply(_message.Message):
    __slots__ = ("users",)
    USERS_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedCompositeFieldContainer[User]
    def __init__(self, users: _Optional[_Iterable[_Union[User, _Mapping]]] = ...) -> None: ...

class AclRequest(_message.Message):
    __slots__ = ("username", "entry")
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    username: str
    entry: PolicyEntry
    def __init__(self, username: _Optional[str] = ..., entry: _Optional[_Union[PolicyEntry, _Mapping]] = ...) -> None: ...

class DeleteAclRequest(_message.Message):
    __slots__ = ("username", "resources")
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    username: str
    resources: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, username: _Optional[str] = ..., resources: _Optional[_Iterable[str]] = ...) -> None: ...

class MappingItem(_message.Message):
    __slots__ = ("gen", "group", "queue_id", "logic_offset", "start_offset", "end_offset")
    GEN_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    LOGIC_OFFSET_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    gen: int
    group: str
    queue_id: int
    logic_offset: int
    start_offset: int
    end_offset: int
    def __init__(self, gen: _Optional[int] = ..., group: _Optional[str] = ..., queue_id: _Optional[int] = ..., logic_offset: _Optional[int] = ..., start_offset: _Optional[int] = ..., end_offset: _Optional[int] = ...) -> None: ...

class LogicQueue(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[MappingItem]
    def __init__(self, items: _Optional[_Iterable[_Union[MappingItem, _Mapping]]] = ...) -> None: ...

class QueueMapping(_message.Message):
    __slots__ = ("topic", "epoch", "queues")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    epoch: int
    queues: _containers.RepeatedCompositeFieldContainer[LogicQueue]
    def __init__(self, topic: _Optional[str] = ..., epoch: _Optional[int] = ..., queues: _Optional[_Iterable[_Union[LogicQueue, _Mapping]]] = ...) -> None: ...

class StaticTopicRequest(_message.Message):
    __slots__ = ("topic", "groups")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    topic: Topic
    groups: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topic: _Optional[_Union[Topic, _Mapping]] = ..., groups: _Optional[_Iterable[str]] = ...) -> None: ...

class SetQueueMappingRequest(_message.Message):
    __slots__ = ("topic", "mapping")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MAPPING_FIELD_NUMBER: _ClassVar[int]
    topic: Topic
    mapping: QueueMapping
    def __init__(self, topic: _Optional[_Union[Topic, _Mapping]] = ..., mapping: _Optional[_Union[QueueMapping, _Mapping]] = ...) -> None: ...

class QueueMappingRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class RemapRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "group")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    group: str
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., group: _Optional[str] = ...) -> None: ...

class QueueMappingReply(_message.Message):
    __slots__ = ("mapping", "topic")
    MAPPING_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    mapping: QueueMapping
    topic: TopicStatus
    def __init__(self, mapping: _Optional[_Union[QueueMapping, _Mapping]] = ..., topic: _Optional[_Union[TopicStatus, _Mapping]] = ...) -> None: ...

class PlaceMessagesRequest(_message.Message):
    __slots__ = ("messages", "from_group")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    FROM_GROUP_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_handed_message_pb2.HandedMessage]
    from_group: str
    def __init__(self, messages: _Optional[_Iterable[_Union[_handed_message_pb2.HandedMessage, _Mapping]]] = ..., from_group: _Optional[str] = ...) -> None: ...

class PlaceMessagesReply(_message.Message):
    __slots__ = ("queue_ids", "queue_offsets")
    QUEUE_IDS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    queue_ids: _containers.RepeatedScalarFieldContainer[int]
    queue_offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, queue_ids: _Optional[_Iterable[int]] = ..., queue_offsets: _Optional[_Iterable[int]] = ...) -> None: ...
