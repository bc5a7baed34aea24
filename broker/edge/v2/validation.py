"""Checks on incoming v2 requests; each failure is a RequestError with the v2 code."""

from __future__ import annotations

import re

from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.broker.catalog import Catalog
from capstan.broker.edge.v2.codes import RequestError
from capstan.broker.store.properties import RESERVED_PROPERTIES
from capstan.broker.store.subscription_groups import SubscriptionGroupConfig, validate_group_name
from capstan.broker.store.topic_config import TopicConfig, validate_topic_name
from capstan.broker.tag_expression import CONTROL_CHARACTERS, parse_tag_expression

_TAG_MAX_CHARS = 1024
_PROPERTY_CODEC_BYTES = re.compile(r"[\x01\x02]")


def topic_name(resource: pb.Resource) -> str:
    problem = validate_topic_name(resource.name)
    if problem is not None:
        raise RequestError(pb.ILLEGAL_TOPIC, problem)
    return resource.name


def group_name(resource: pb.Resource) -> str:
    problem = validate_group_name(resource.name)
    if problem is not None:
        raise RequestError(pb.ILLEGAL_CONSUMER_GROUP, problem)
    return resource.name


def existing_topic(catalog: Catalog, resource: pb.Resource, create: bool = False) -> TopicConfig:
    """The named topic's config (auto-created if `create` and the broker allows it)."""
    name = topic_name(resource)
    config = catalog.topic(name, create=create)
    if config is None:
        raise RequestError(pb.TOPIC_NOT_FOUND, f"topic {name!r} does not exist")
    return config


def existing_group(catalog: Catalog, resource: pb.Resource) -> SubscriptionGroupConfig:
    name = group_name(resource)
    config = catalog.group(name)
    if config is None:
        raise RequestError(pb.CONSUMER_GROUP_NOT_FOUND, f"consumer group {name!r} does not exist")
    return config


def check_tag(tag: str) -> None:
    if not tag.strip():
        raise RequestError(pb.ILLEGAL_MESSAGE_TAG, "tag must not be blank")
    if "|" in tag or CONTROL_CHARACTERS.search(tag):
        raise RequestError(
            pb.ILLEGAL_MESSAGE_TAG, f"tag {tag!r} may not contain '|' or control characters"
        )
    if len(tag) > _TAG_MAX_CHARS:
        raise RequestError(pb.ILLEGAL_MESSAGE_TAG, f"tag longer than {_TAG_MAX_CHARS} characters")


def check_keys(keys: list[str]) -> None:
    for key in keys:
        if not key.strip() or " " in key or CONTROL_CHARACTERS.search(key):
            raise RequestError(
                pb.ILLEGAL_MESSAGE_KEY, f"key {key!r} must be non-blank, without spaces"
            )


def check_message_group(group: str) -> None:
    if not group.strip() or CONTROL_CHARACTERS.search(group) or len(group) > 64:
        raise RequestError(
            pb.ILLEGAL_MESSAGE_GROUP, "message group must be 1..64 printable characters"
        )


def check_user_properties(props: dict[str, str]) -> None:
    for name, value in props.items():
        if not name or name in RESERVED_PROPERTIES:
            raise RequestError(
                pb.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property name {name!r} is reserved or empty"
            )
        if _PROPERTY_CODEC_BYTES.search(name) or _PROPERTY_CODEC_BYTES.search(value):
            raise RequestError(
                pb.ILLEGAL_MESSAGE_PROPERTY_KEY,
                f"property {name!r} contains the bytes 0x01 or 0x02",
            )


def tag_filter(expression: pb.FilterExpression) -> set[str] | None:
    """The set of accepted tags, or None for every message (`*` or empty)."""
    if expression.type == pb.SQL:
        raise RequestError(pb.ILLEGAL_FILTER_EXPRESSION, "SQL filters are not supported")
    try:
        return parse_tag_expression(expression.expression)
    except ValueError as exc:
        raise RequestError(pb.ILLEGAL_FILTER_EXPRESSION, str(exc)) from None
