from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class HandedMessage(_message.Message):
    __slots__ = ("topic", "queue_id", "body", "properties", "flag", "sys_flag", "born_timestamp_ms", "born_host", "reconsume_times")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    SYS_FLAG_FIELD_NUMBER: _ClassVar[int]
    BORN_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    BORN_HOST_FIELD_NUMBER: _ClassVar[int]
    RECONSUME_TIMES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    body: bytes
    properties: _containers.ScalarMap[str, str]
    flag: int
    sys_flag: int
    born_timestamp_ms: int
    born_host: bytes
    reconsume_times: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., body: _Optional[bytes] = ..., properties: _Optional[_Mapping[str, str]] = ..., flag: _Optional[int] = ..., sys_flag: _Optional[int] = ..., born_timestamp_ms: _Optional[int] = ..., born_host: _Optional[bytes] = ..., reconsume_times: _Optional[int] = ...) -> None: ...
