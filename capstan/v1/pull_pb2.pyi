from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PullStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PULL_STATUS_UNSPECIFIED: _ClassVar[PullStatus]
    FOUND: _ClassVar[PullStatus]
    NO_NEW_MSG: _ClassVar[PullStatus]
    NO_MATCHED_MSG: _ClassVar[PullStatus]
    OFFSET_ILLEGAL: _ClassVar[PullStatus]
PULL_STATUS_UNSPECIFIED: PullStatus
FOUND: PullStatus
NO_NEW_MSG: PullStatus
NO_MATCHED_MSG: PullStatus
OFFSET_ILLEGAL: PullStatus

class PullMessagesRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id", "offset", "max_messages", "tag_expression", "long_polling_ms", "max_bytes")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TAG_EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    LONG_POLLING_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    offset: int
    max_messages: int
    tag_expression: str
    long_polling_ms: int
    max_bytes: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., max_messages: _Optional[int] = ..., tag_expression: _Optional[str] = ..., long_polling_ms: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class PulledMessage(_message.Message):
    __slots__ = ("queue_id", "queue_offset", "commit_log_offset", "message_id", "body", "properties", "born_timestamp_ms", "store_timestamp_ms", "born_host", "store_host", "reconsume_times", "sys_flag", "body_crc", "flag")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMIT_LOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    BORN_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    STORE_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    BORN_HOST_FIELD_NUMBER: _ClassVar[int]
    STORE_HOST_FIELD_NUMBER: _ClassVar[int]
    RECONSUME_TIMES_FIELD_NUMBER: _ClassVar[int]
    SYS_FLAG_FIELD_NUMBER: _ClassVar[int]
    BODY_CRC_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    message_id: str
    body: bytes
    properties: _containers.ScalarMap[str, str]
    born_timestamp_ms: int
    store_timestamp_ms: int
    born_host: str
    store_host: str
    reconsume_times: int
    sys_flag: int
    body_crc: int
    flag: int
    def __init__(self, queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., commit_log_offset: _Optional[int] = ..., message_id: _Optional[str] = ..., body: _Optional[bytes] = ..., properties: _Optional[_Mapping[str, str]] = ..., born_timestamp_ms: _Optional[int] = ..., store_timestamp_ms: _Optional[int] = ..., born_host: _Optional[str] = ..., store_host: _Optional[str] = ..., reconsume_times: _Optional[int] = ..., sys_flag: _Optional[int] = ..., body_crc: _Optional[int] = ..., flag: _Optional[int] = ...) -> None: ...

class PullMessagesResponse(_message.Message):
    __slots__ = ("status", "next_begin_offset", "min_offset", "max_offset", "messages", "unreadable_offsets", "continues_on", "commit_wanted")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NEXT_BEGIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    UNREADABLE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    CONTINUES_ON_FIELD_NUMBER: _ClassVar[int]
    COMMIT_WANTED_FIELD_NUMBER: _ClassVar[int]
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: _containers.RepeatedCompositeFieldContainer[PulledMessage]
    unreadable_offsets: _containers.RepeatedScalarFieldContainer[int]
    continues_on: str
    commit_wanted: bool
    def __init__(self, status: _Optional[_Union[PullStatus, str]] = ..., next_begin_offset: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[PulledMessage, _Mapping]]] = ..., unreadable_offsets: _Optional[_Iterable[int]] = ..., continues_on: _Optional[str] = ..., commit_wanted: _Optional[bool] = ...) -> None: ...
