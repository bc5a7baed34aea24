"""The ACL decision: resources by name, prefix and '*', actions, deny over allow, sources."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capstan.security.acl import (
    AclError,
    Action,
    PolicyEntry,
    ResourceType,
    User,
    UserType,
    decide,
    grant,
)

TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER


def user(*entries: dict[str, object], type: UserType = UserType.NORMAL) -> User:
    return User("u1", "secret-1", type, policy=tuple(PolicyEntry.from_document(e) for e in entries))


def allow(resources: list[str], actions: list[str], **more: object) -> dict[str, object]:
    return {"resources": resources, "actions": actions, "decision": "Allow", **more}


def deny(resources: list[str], actions: list[str], **more: object) -> dict[str, object]:
    return {"resources": resources, "actions": actions, "decision": "Deny", **more}


def allowed(u: User, *needs: object, source: str | None = "10.0.0.7") -> bool:
    return decide(u, needs, source).allowed  # type: ignore[arg-type]


def test_a_user_allowed_to_publish_to_one_topic_may_not_publish_to_another():
    u = user(allow(["Topic:orders"], ["Pub"]))
    assert allowed(u, grant(TOPIC, "orders", Action.PUB))
    assert not allowed(u, grant(TOPIC, "orders-eu", Action.PUB))
    assert not allowed(u, grant(TOPIC, "orders", Action.SUB))


def test_prefixes_and_stars_match_what_they_say():
    u = user(allow(["Topic:orders-*", "Group:*"], ["Sub"]))
    assert allowed(u, grant(TOPIC, "orders-eu", Action.SUB), grant(GROUP, "any", Action.SUB))
    assert not allowed(u, grant(TOPIC, "order", Action.SUB))
    assert not allowed(u, grant(CLUSTER, "c", Action.SUB))
    everything = user(allow(["*"], ["All"]))
    assert allowed(everything, grant(CLUSTER, "c", Action.UPDATE))


def test_every_grant_a_call_needs_must_be_held():
    u = user(allow(["Topic:orders"], ["Sub"]))
    assert not allowed(u, grant(TOPIC, "orders", Action.SUB), grant(GROUP, "billing", Action.SUB))


def test_one_of_several_actions_is_enough_for_a_route_lookup():
    u = user(allow(["Topic:orders"], ["Sub"]))
    assert allowed(u, grant(TOPIC, "orders", Action.PUB, Action.SUB))


def test_a_deny_beats_an_allow_however_they_are_ordered():
    for entries in (
        [allow(["Topic:*"], ["Pub"]), deny(["Topic:secret"], ["Pub"])],
        [deny(["Topic:secret"], ["Pub"]), allow(["Topic:*"], ["Pub"])],
    ):
        u = user(*entries)
        assert allowed(u, grant(TOPIC, "public", Action.PUB))
        assert not allowed(u, grant(TOPIC, "secret", Action.PUB))


def test_an_entry_with_sources_holds_only_for_calls_from_them():
    u = user(allow(["Topic:orders"], ["Pub"], sourceIps=["10.0.0.0/24", "fd00::1"]))
    assert allowed(u, grant(TOPIC, "orders", Action.PUB), source="10.0.0.7")
    assert allowed(u, grant(TOPIC, "orders", Action.PUB), source="fd00::1")
    assert not allowed(u, grant(TOPIC, "orders", Action.PUB), source="10.0.1.7")
    assert not allowed(u, grant(TOPIC, "orders", Action.PUB), source=None)


def test_a_super_user_may_do_anything_and_a_user_without_policy_nothing():
    assert allowed(user(type=UserType.SUPER), grant(CLUSTER, "c", Action.DELETE))
    assert not allowed(user(), grant(TOPIC, "orders", Action.SUB))


def test_the_refused_grant_is_named():
    verdict = decide(user(), [grant(TOPIC, "orders", Action.PUB)], None)
    assert str(verdict.refused) == "Pub on Topic:orders"


@pytest.mark.parametrize(
    "entry, complaint",
    [
        ({"resources": ["Queue:x"], "actions": ["Pub"]}, "resource type"),
        ({"resources": ["Topic:a*b"], "actions": ["Pub"]}, "'*' may only end"),
        ({"resources": ["Topic:a"], "actions": ["Publish"]}, "an action must be one of"),
        ({"resources": ["Topic:a"], "actions": ["Pub"], "decision": "Maybe"}, "a decision"),
        ({"resources": [], "actions": ["Pub"]}, "needs resources"),
        ({"resources": ["Topic:a"], "actions": ["Pub"], "sourceIps": ["nowhere"]}, "CIDR"),
        ({"resources": ["Topic:a"], "actions": ["Pub"], "colour": "red"}, "unknown fields: colour"),
    ],
)
def test_a_bad_policy_entry_is_refused_with_what_is_wrong(entry: dict[str, object], complaint: str):
    with pytest.raises(AclError, match=complaint):
        PolicyEntry.from_document(entry)


def test_a_user_document_round_trips_and_hides_its_secret_on_request():
    u = user(allow(["Topic:orders-*"], ["Pub", "Sub"], sourceIps=["10.0.0.0/8"]))
    assert User.from_document(u.to_document()) == u
    assert "password" not in u.to_document(with_secret=False)
    assert "secret-1" not in repr(u)
    with pytest.raises(AclError, match="user name"):
        User("bad name", "secret-1")
    with pytest.raises(AclError, match="6 to 256"):
        User("ok", "short")


names = st.text(alphabet="abc-", min_size=1, max_size=6)


@given(prefix=names, name=names)
def test_a_prefix_pattern_matches_exactly_the_names_that_start_with_it(prefix: str, name: str):
    u = user(allow([f"Topic:{prefix}*"], ["Pub"]))
    assert allowed(u, grant(TOPIC, name, Action.PUB)) == name.startswith(prefix)
