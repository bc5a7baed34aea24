"""The controller's decisions over what broker groups answered a call passed to each of
them (pure): whether a change or a read succeeded, and how the groups' replies combine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from capstan.common.errors import CapstanError
from capstan.v1 import admin_pb2 as pb
from capstan.v1 import consumer_pb2 as cpb

NO_GROUPS = "no broker group has registered with this controller"


@dataclass(frozen=True)
class GroupOutcome:
    """One broker group's answer to a call passed to it: the reply, or why it failed."""

    group: str
    reply: Any = None
    code: grpc.StatusCode | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.code is None

    def reason(self) -> str:
        return f"{self.group}: {self.code.name if self.code else 'OK'}: {self.detail}"


@dataclass(frozen=True)
class Refusal:
    code: grpc.StatusCode
    detail: str


class Refused(CapstanError):
    """A call the controller answers with `refusal`."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.detail)
        self.refusal = refusal


def change_refusal(what: str, outcomes: Sequence[GroupOutcome]) -> Refusal | None:
    """None when every group made the change `what`; otherwise the answer naming the
    groups that failed and why, and those that changed (and stay changed)."""
    if not outcomes:
        return Refusal(grpc.StatusCode.UNAVAILABLE, NO_GROUPS)
    failed = [o for o in outcomes if not o.ok]
    if not failed:
        return None
    reasons = "; ".join(o.reason() for o in failed)
    done = [o.group for o in outcomes if o.ok]
    codes = {o.code for o in failed}
    if not done and len(codes) == 1 and failed[0].code is not None:
        return Refusal(failed[0].code, f"{what} failed on every broker group ({reasons})")
    kept = f"; the change was made on {', '.join(done)} and stays" if done else ""
    return Refusal(
        grpc.StatusCode.FAILED_PRECONDITION,
        f"{what} failed on {len(failed)} of {len(outcomes)} broker groups ({reasons}){kept}",
    )


def read_refusal(what: str, outcomes: Sequence[GroupOutcome], missing_ok: bool) -> Refusal | None:
    """None when every group answered (with `missing_ok`, NOT_FOUND counts as an answer);
    otherwise the first failure's code, naming every group that failed."""
    missing = grpc.StatusCode.NOT_FOUND if missing_ok else None
    failed = [o for o in outcomes if o.code is not None and o.code is not missing]
    if not failed or failed[0].code is None:
        return None
    reasons = "; ".join(o.reason() for o in failed)
    return Refusal(failed[0].code, f"{what} failed on a broker group ({reasons})")


def not_found(outcomes: Sequence[GroupOutcome]) -> Refusal:
    """The answer when no group has what was asked for, in the first group's words."""
    detail = outcomes[0].detail if outcomes else NO_GROUPS
    return Refusal(grpc.StatusCode.NOT_FOUND, f"{detail} (asked every broker group)")


def union_topics(replies: Sequence[pb.ListTopicsReply]) -> pb.ListTopicsReply:
    """Every group's entry of every topic, by topic name, then in the order given: the
    groups may hold a topic with different settings, and each has its own queues."""
    entries: list[pb.TopicStatus] = [status for reply in replies for status in reply.topics]
    entries.sort(key=lambda s: s.topic.name)
    return pb.ListTopicsReply(topics=entries)


def merge_topic(statuses: Sequence[pb.TopicStatus]) -> pb.TopicStatus:
    """One topic as several broker groups show it: the first one's settings, every group's
    queues (in the order given, each naming its group) and every group named."""
    return pb.TopicStatus(
        topic=statuses[0].topic,
        queues=[q for s in statuses for q in s.queues],
        system=statuses[0].system,
        brokers=[b for s in statuses for b in s.brokers],
    )


def merge_group(statuses: Sequence[pb.GroupStatus]) -> pb.GroupStatus:
    """One consumer group as several broker groups show it: the first one's settings, every
    group's queue offsets (in the order given, each naming its group) and lag, each client
    and member once, and every group named."""
    clients: dict[str, pb.GroupClient] = {}
    members: dict[str, cpb.Member] = {}
    for status in statuses:
        for client in status.clients:
            clients.setdefault(client.client_id, client)
        for member in status.members.members:
            members.setdefault(member.client_id, member)
    problems = [s.members.inconsistency for s in statuses if s.members.inconsistency]
    return pb.GroupStatus(
        group=statuses[0].group,
        offsets=[o for s in statuses for o in s.offsets],
        clients=list(clients.values()),
        total_lag=sum(s.total_lag for s in statuses),
        members=cpb.GroupMembers(
            group=statuses[0].members.group,
            members_version=max(s.members.members_version for s in statuses),
            members=[members[c] for c in sorted(members)],
            subscriptions_consistent=not problems,
            inconsistency=problems[0] if problems else "",
        ),
        brokers=[b for s in statuses for b in s.brokers],
    )


def union_groups(replies: Sequence[pb.ListGroupsReply]) -> pb.ListGroupsReply:
    """Every broker group's entry of every consumer group, by name, then in the order given:
    lag and clients are each broker group's own."""
    entries: list[pb.GroupStatus] = [status for reply in replies for status in reply.groups]
    entries.sort(key=lambda s: s.group.name)
    return pb.ListGroupsReply(groups=entries)


def union_users(replies: Sequence[pb.ListUsersReply]) -> pb.ListUsersReply:
    """Each user once, as the first group that has it describes it."""
    seen: dict[str, pb.User] = {}
    for reply in replies:
        for user in reply.users:
            seen.setdefault(user.username, user)
    return pb.ListUsersReply(users=[seen[name] for name in sorted(seen)])


def lookup_refusal(
    request: pb.GetMessageRequest, outcomes: Sequence[GroupOutcome], found: bool
) -> Refusal | None:
    """Whether GetMessage must fail: a message found by id is the whole answer (an id is
    stored once), whereas by key a group that failed may hold more of them."""
    if found and request.WhichOneof("by") == "message_id":
        return None
    refusal = read_refusal("GetMessage", outcomes, True)
    if refusal is None and not found:
        return not_found(outcomes)
    return refusal
