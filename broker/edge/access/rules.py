"""The grants shared by both protocols' tables: a topic, a group, the cluster.

A group's retry and dead-letter topics (`%RETRY%G`, `%DLQ%G`) belong to the group: who may
consume as G may read and re-deliver them, so they are checked as the group.
"""

from __future__ import annotations

from functools import lru_cache

from capstan.broker.system_topics import DLQ_PREFIX, RETRY_PREFIX
from capstan.security.acl import Action, Grant, ResourceType, grant

SUB, PUB = Action.SUB, Action.PUB


@lru_cache(maxsize=4096)
def topic(name: str, *actions: Action) -> Grant:
    for prefix in (RETRY_PREFIX, DLQ_PREFIX):
        if name.startswith(prefix):
            return grant(ResourceType.GROUP, name[len(prefix) :], *actions)
    return grant(ResourceType.TOPIC, name, *actions)


@lru_cache(maxsize=4096)
def group(name: str, *actions: Action) -> Grant:
    return grant(ResourceType.GROUP, name, *actions)


def consume(topic_name: str, group_name: str) -> list[Grant]:
    """What reading `topic_name` as `group_name` needs: Sub on both (on the topic alone for
    a read that names no group)."""
    needs = [topic(topic_name, SUB)]
    return [*needs, group(group_name, SUB)] if group_name else needs


def cluster(name: str, action: Action) -> Grant:
    return grant(ResourceType.CLUSTER, name, action)
