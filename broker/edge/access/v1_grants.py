"""What each capstan.v1 call of the broker needs.

Admin: creating, changing, deleting and describing a topic or group need Create, Update,
Delete and Get on it; resetting a group's offsets Update on the group; reading a stored
message Sub on its topic; compacting a topic Update on it; listing topics or groups List on
the cluster (the broker group's name), describing the broker Get on it, and handing its
leadership over Update on it. A static topic's mapping: Create on the topic to make one, Update
to hand one over or move a queue (the controller passes the caller's signature on to the
brokers, so making one through it needs Update too), Get to read it. The consumer
and pull services need Sub on the topics and group they touch, as v2's receive does.

Replication between replicas is not a user's business: those services are admitted by the
cluster's identity (TLS), never by a user's signature.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from capstan.broker.edge.access.rules import SUB, cluster, consume, group, topic
from capstan.security.acl import Action, Grant

Needs = Callable[[Any, str], list[Grant]]
"""A request and the cluster's name -> the grants it needs."""

C, U, D, G, L = Action.CREATE, Action.UPDATE, Action.DELETE, Action.GET, Action.LIST


def _topic(action: Action) -> Needs:
    return lambda r, _: [topic(r.name, action)]


def _group(action: Action) -> Needs:
    return lambda r, _: [group(r.name, action)]


def _cluster(action: Action) -> Needs:
    return lambda _, name: [cluster(name, action)]


def _member(request: Any, _: str) -> list[Grant]:
    return [group(request.group, SUB)]


def _heartbeat(request: Any, _: str) -> list[Grant]:
    return [group(request.group, SUB)] + [topic(s.topic, SUB) for s in request.subscriptions]


def _queues(request: Any, _: str) -> list[Grant]:
    topics = sorted({q.topic for q in request.queues})
    return [group(request.group, SUB)] + [topic(t, SUB) for t in topics]


def _offsets(request: Any, _: str) -> list[Grant]:
    topics = sorted({o.topic for o in request.offsets})
    return [group(request.group, SUB)] + [topic(t, SUB) for t in topics]


def _topic_read(request: Any, _: str) -> list[Grant]:
    return [topic(request.topic, SUB)]


def _group_topic(request: Any, _: str) -> list[Grant]:
    return consume(request.topic, request.group)


NEEDS: dict[str, Needs] = {
    "capstan.v1.Admin/CreateTopic": _topic(C),
    "capstan.v1.Admin/UpdateTopic": _topic(U),
    "capstan.v1.Admin/DeleteTopic": _topic(D),
    "capstan.v1.Admin/DescribeTopic": _topic(G),
    "capstan.v1.Admin/ListTopics": _cluster(L),
    "capstan.v1.Admin/CreateGroup": _group(C),
    "capstan.v1.Admin/UpdateGroup": _group(U),
    "capstan.v1.Admin/DeleteGroup": _group(D),
    "capstan.v1.Admin/DescribeGroup": _group(G),
    "capstan.v1.Admin/ListGroups": _cluster(L),
    "capstan.v1.Admin/ResetOffset": lambda r, _: [group(r.group, U), topic(r.topic, SUB)],
    "capstan.v1.Admin/GetMessage": _topic_read,
    "capstan.v1.Admin/DescribeBroker": _cluster(G),
    "capstan.v1.Admin/HandOver": _cluster(U),
    "capstan.v1.Admin/CreateStaticTopic": lambda r, _: [topic(r.topic.name, C)],
    "capstan.v1.Admin/SetQueueMapping": lambda r, _: [topic(r.topic.name, U)],
    "capstan.v1.Admin/GetQueueMapping": lambda r, _: [topic(r.topic, G)],
    "capstan.v1.Admin/RemapStaticQueue": lambda r, _: [topic(r.topic, U)],
    "capstan.v1.Admin/RetireStaticGroup": lambda r, _: [topic(r.topic, U)],
    "capstan.v1.Consumer/Heartbeat": _heartbeat,
    "capstan.v1.Consumer/WatchGroup": _member,
    "capstan.v1.Consumer/Unregister": _member,
    "capstan.v1.Consumer/GetMembers": _member,
    "capstan.v1.Consumer/LockQueues": _queues,
    "capstan.v1.Consumer/UnlockQueues": _queues,
    "capstan.v1.Consumer/CommitOffsets": _offsets,
    "capstan.v1.Consumer/QueryOffset": _group_topic,
    "capstan.v1.Consumer/SearchOffset": _topic_read,
    "capstan.v1.Consumer/GetQueueBounds": _topic_read,
    "capstan.v1.Consumer/SendBack": _member,
    "capstan.v1.Pull/PullMessages": _group_topic,
}
"""Per unary or server-streaming method, by its full name."""


def chunk_needs(method: str, chunk: Any) -> list[Grant]:
    """What one message of a request stream needs: a compaction's header names its topic."""
    if method == "capstan.v1.Admin/CompactTopic" and chunk.HasField("header"):
        return [topic(chunk.header.topic, U)]
    return []


CLUSTER_ONLY = frozenset({"capstan.v1.Replication", "capstan.v1.ReplicaPeers"})
"""Services only the cluster's own processes call."""

SUPER_ONLY = frozenset(
    f"capstan.v1.Admin/{name}"
    for name in (
        "CreateUser",
        "UpdateUser",
        "DeleteUser",
        "GetUser",
        "ListUsers",
        "CreateAcl",
        "DeleteAcl",
        "PlaceMessages",
    )
)
"""Methods for super users alone: managing users and their policies, and storing the
messages another broker group hands on (the cluster's own call). (The guard refuses
every method missing from NEEDS to normal users; this names the ones meant that way.)"""
