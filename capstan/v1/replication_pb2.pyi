from capstan.v1 import handed_message_pb2 as _handed_message_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FetchRecordRequest(_message.Message):
    __slots__ = ("broker_name", "offset")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    offset: int
    def __init__(self, broker_name: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class FetchRecordReply(_message.Message):
    __slots__ = ("record",)
    RECORD_FIELD_NUMBER: _ClassVar[int]
    record: bytes
    def __init__(self, record: _Optional[bytes] = ...) -> None: ...

class FetchCompactedRequest(_message.Message):
    __slots__ = ("topic", "generation")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    generation: int
    def __init__(self, topic: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...

class CompactedFile(_message.Message):
    __slots__ = ("current_json", "name", "offset", "data")
    CURRENT_JSON_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    current_json: str
    name: str
    offset: int
    data: bytes
    def __init__(self, current_json: _Optional[str] = ..., name: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class CheckBackRequest(_message.Message):
    __slots__ = ("broker_name", "topic", "transaction_id", "half_record", "any_producer")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    HALF_RECORD_FIELD_NUMBER: _ClassVar[int]
    ANY_PRODUCER_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    topic: str
    transaction_id: str
    half_record: bytes
    any_producer: bool
    def __init__(self, broker_name: _Optional[str] = ..., topic: _Optional[str] = ..., transaction_id: _Optional[str] = ..., half_record: _Optional[bytes] = ..., any_producer: _Optional[bool] = ...) -> None: ...

class CheckBackReply(_message.Message):
    __slots__ = ("asked",)
    ASKED_FIELD_NUMBER: _ClassVar[int]
    asked: bool
    def __init__(self, asked: _Optional[bool] = ...) -> None: ...

class ProbeRequest(_message.Message):
    __slots__ = ("broker_name", "broker_id")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    broker_id: int
    def __init__(self, broker_name: _Optional[str] = ..., broker_id: _Optional[int] = ...) -> None: ...

class ProbeReply(_message.Message):
    __slots__ = ("broker_name", "broker_id", "role", "acting", "master_generation", "acted_over_generation", "max_offset")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ACTING_FIELD_NUMBER: _ClassVar[int]
    MASTER_GENERATION_FIELD_NUMBER: _ClassVar[int]
    ACTED_OVER_GENERATION_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    broker_id: int
    role: str
    acting: bool
    master_generation: int
    acted_over_generation: int
    max_offset: int
    def __init__(self, broker_name: _Optional[str] = ..., broker_id: _Optional[int] = ..., role: _Optional[str] = ..., acting: _Optional[bool] = ..., master_generation: _Optional[int] = ..., acted_over_generation: _Optional[int] = ..., max_offset: _Optional[int] = ...) -> None: ...

class TakeBackRequest(_message.Message):
    __slots__ = ("broker_name", "master_generation")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    MASTER_GENERATION_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    master_generation: int
    def __init__(self, broker_name: _Optional[str] = ..., master_generation: _Optional[int] = ...) -> None: ...

class TakeBackReply(_message.Message):
    __slots__ = ("acted", "state", "acted_since_ms")
    ACTED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ACTED_SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    acted: bool
    state: Metadata
    acted_since_ms: int
    def __init__(self, acted: _Optional[bool] = ..., state: _Optional[_Union[Metadata, _Mapping]] = ..., acted_since_ms: _Optional[int] = ...) -> None: ...

class EscapeRequest(_message.Message):
    __slots__ = ("from_broker", "messages")
    FROM_BROKER_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    from_broker: str
    messages: _containers.RepeatedCompositeFieldContainer[_handed_message_pb2.HandedMessage]
    def __init__(self, from_broker: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_handed_message_pb2.HandedMessage, _Mapping]]] = ...) -> None: ...

class EscapeReply(_message.Message):
    __slots__ = ("status", "detail")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    status: str
    detail: str
    def __init__(self, status: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class EpochRange(_message.Message):
    __slots__ = ("epoch", "start_offset")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    start_offset: int
    def __init__(self, epoch: _Optional[int] = ..., start_offset: _Optional[int] = ...) -> None: ...

class ReplicaToMaster(_message.Message):
    __slots__ = ("follow", "ack", "leave")
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    LEAVE_FIELD_NUMBER: _ClassVar[int]
    follow: Follow
    ack: ReplicaAck
    leave: Leave
    def __init__(self, follow: _Optional[_Union[Follow, _Mapping]] = ..., ack: _Optional[_Union[ReplicaAck, _Mapping]] = ..., leave: _Optional[_Union[Leave, _Mapping]] = ...) -> None: ...

class Leave(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Follow(_message.Message):
    __slots__ = ("broker_name", "broker_id", "address", "master_epoch", "max_offset", "epochs", "segment_bytes")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    broker_id: int
    address: str
    master_epoch: int
    max_offset: int
    epochs: _containers.RepeatedCompositeFieldContainer[EpochRange]
    segment_bytes: int
    def __init__(self, broker_name: _Optional[str] = ..., broker_id: _Optional[int] = ..., address: _Optional[str] = ..., master_epoch: _Optional[int] = ..., max_offset: _Optional[int] = ..., epochs: _Optional[_Iterable[_Union[EpochRange, _Mapping]]] = ..., segment_bytes: _Optional[int] = ...) -> None: ...

class ReplicaAck(_message.Message):
    __slots__ = ("stored_offset", "flushed_offset", "metadata_sequence", "damaged", "damaged_offset", "whole_state_wanted")
    STORED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    FLUSHED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    METADATA_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    DAMAGED_FIELD_NUMBER: _ClassVar[int]
    DAMAGED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    WHOLE_STATE_WANTED_FIELD_NUMBER: _ClassVar[int]
    stored_offset: int
    flushed_offset: int
    metadata_sequence: int
    damaged: bool
    damaged_offset: int
    whole_state_wanted: bool
    def __init__(self, stored_offset: _Optional[int] = ..., flushed_offset: _Optional[int] = ..., metadata_sequence: _Optional[int] = ..., damaged: _Optional[bool] = ..., damaged_offset: _Optional[int] = ..., whole_state_wanted: _Optional[bool] = ...) -> None: ...

class MasterToReplica(_message.Message):
    __slots__ = ("start", "chunk", "metadata", "beat")
    START_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    BEAT_FIELD_NUMBER: _ClassVar[int]
    start: StartCopy
    chunk: LogChunk
    metadata: Metadata
    beat: Beat
    def __init__(self, start: _Optional[_Union[StartCopy, _Mapping]] = ..., chunk: _Optional[_Union[LogChunk, _Mapping]] = ..., metadata: _Optional[_Union[Metadata, _Mapping]] = ..., beat: _Optional[_Union[Beat, _Mapping]] = ...) -> None: ...

class StartCopy(_message.Message):
    __slots__ = ("master_epoch", "master_id", "truncate_to", "copy_from", "epochs")
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MASTER_ID_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_TO_FIELD_NUMBER: _ClassVar[int]
    COPY_FROM_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    master_epoch: int
    master_id: int
    truncate_to: int
    copy_from: int
    epochs: _containers.RepeatedCompositeFieldContainer[EpochRange]
    def __init__(self, master_epoch: _Optional[int] = ..., master_id: _Optional[int] = ..., truncate_to: _Optional[int] = ..., copy_from: _Optional[int] = ..., epochs: _Optional[_Iterable[_Union[EpochRange, _Mapping]]] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("offset", "data", "confirm_offset")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    confirm_offset: int
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ..., confirm_offset: _Optional[int] = ...) -> None: ...

class Metadata(_message.Message):
    __slots__ = ("topics_json", "groups_json", "consumer_offsets_json", "pop_state_json", "timer_progress_json", "transaction_progress_json", "handle_key", "queue_locks_json", "sequence", "compacted_json", "users_json", "queue_mappings_json", "pop_state_lines")
    TOPICS_JSON_FIELD_NUMBER: _ClassVar[int]
    GROUPS_JSON_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_OFFSETS_JSON_FIELD_NUMBER: _ClassVar[int]
    POP_STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    TIMER_PROGRESS_JSON_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_PROGRESS_JSON_FIELD_NUMBER: _ClassVar[int]
    HANDLE_KEY_FIELD_NUMBER: _ClassVar[int]
    QUEUE_LOCKS_JSON_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    COMPACTED_JSON_FIELD_NUMBER: _ClassVar[int]
    USERS_JSON_FIELD_NUMBER: _ClassVar[int]
    QUEUE_MAPPINGS_JSON_FIELD_NUMBER: _ClassVar[int]
    POP_STATE_LINES_FIELD_NUMBER: _ClassVar[int]
    topics_json: str
    groups_json: str
    consumer_offsets_json: str
    pop_state_json: str
    timer_progress_json: str
    transaction_progress_json: str
    handle_key: bytes
    queue_locks_json: str
    sequence: int
    compacted_json: str
    users_json: str
    queue_mappings_json: str
    pop_state_lines: str
    def __init__(self, topics_json: _Optional[str] = ..., groups_json: _Optional[str] = ..., consumer_offsets_json: _Optional[str] = ..., pop_state_json: _Optional[str] = ..., timer_progress_json: _Optional[str] = ..., transaction_progress_json: _Optional[str] = ..., handle_key: _Optional[bytes] = ..., queue_locks_json: _Optional[str] = ..., sequence: _Optional[int] = ..., compacted_json: _Optional[str] = ..., users_json: _Optional[str] = ..., queue_mappings_json: _Optional[str] = ..., pop_state_lines: _Optional[str] = ...) -> None: ...

class Beat(_message.Message):
    __slots__ = ("master_max_offset", "confirm_offset")
    MASTER_MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    master_max_offset: int
    confirm_offset: int
    def __init__(self, master_max_offset: _Optional[int] = ..., confirm_offset: _Optional[int] = ...) -> None: ...
