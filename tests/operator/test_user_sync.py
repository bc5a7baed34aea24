"""What a CapstanUser asks of a broker group and the one step that brings the group's copy
of the user there (operator/user_sync.py)."""

from __future__ import annotations

import pytest

from capstan.operator import user_sync
from capstan.operator.user_sync import UserAction
from capstan.security.acl import AclError, UserType
from capstan.v1 import admin_pb2 as pb

SPEC = {
    "brokerGroups": ["orders"],
    "acl": [
        {"resources": ["Topic:orders", "Group:billing-*"], "actions": ["Pub", "Sub"]},
        {"resources": ["Topic:orders-secret"], "actions": ["All"], "decision": "Deny"},
    ],
}


def held(wanted: user_sync.WantedUser) -> pb.User:
    """The user as a broker answers it after taking `wanted` (no secret key)."""
    step = user_sync.next_user_step(wanted, None, True)
    request = user_sync.request_of(wanted, "s" * 32, step)
    request.secret_key = ""
    return request


def test_the_resource_names_the_user_and_its_whole_policy() -> None:
    wanted = user_sync.wanted_user("billing-app", SPEC)
    assert wanted.name == "billing-app" and wanted.user_type is UserType.NORMAL
    assert wanted.enabled and len(wanted.policy) == 2
    named = user_sync.wanted_user("x", {**SPEC, "userName": "billing", "userType": "Super"})
    assert named.name == "billing" and named.user_type is UserType.SUPER
    assert user_sync.user_secret("billing-app") == "capstan-user-billing-app"


@pytest.mark.parametrize(
    ("spec", "complaint"),
    [
        ({"acl": [{"resources": ["Topic:a"], "actions": ["Fly"]}]}, r"spec\.acl\[0\]"),
        ({"acl": [{"resources": ["Bucket:a"], "actions": ["Pub"]}]}, r"spec\.acl\[0\]"),
        (
            {"acl": [{"resources": ["Topic:a"], "actions": ["Pub"], "sourceIps": ["nowhere"]}]},
            r"spec\.acl\[0\]: a source",
        ),
        ({"userName": "has space"}, "user name"),
    ],
)
def test_a_policy_the_broker_would_refuse_is_refused_by_field(
    spec: dict[str, object], complaint: str
) -> None:
    with pytest.raises(AclError, match=complaint):
        user_sync.wanted_user("u", {"brokerGroups": ["g"], **spec})


def test_a_missing_user_is_created_with_its_keys_and_then_left_alone() -> None:
    wanted = user_sync.wanted_user("billing-app", SPEC)
    step = user_sync.next_user_step(wanted, None, keys_changed=False)
    assert step.action is UserAction.CREATE and step.with_keys
    request = user_sync.request_of(wanted, "k" * 32, step)
    assert request.secret_key == "k" * 32 and not request.replace_policy
    assert list(request.policy[0].resources) == ["Topic:orders", "Group:billing-*"]
    same = user_sync.next_user_step(wanted, held(wanted), keys_changed=False)
    assert same.action is UserAction.IN_SYNC and not same.with_keys


def test_drift_is_set_back_in_one_update_of_the_whole_policy() -> None:
    wanted = user_sync.wanted_user("billing-app", SPEC)
    found = held(wanted)
    del found.policy[1]  # someone deleted the deny entry on the brokers
    found.user_type = "Super"
    step = user_sync.next_user_step(wanted, found, keys_changed=False)
    assert step.action is UserAction.UPDATE and not step.with_keys
    assert "type Super" in step.reason and "its policy" in step.reason
    request = user_sync.request_of(wanted, "k" * 32, step)
    assert request.replace_policy and len(request.policy) == 2 and request.secret_key == ""


def test_changed_keys_and_a_disabled_user_are_pushed() -> None:
    wanted = user_sync.wanted_user("billing-app", SPEC)
    rotated = user_sync.next_user_step(wanted, held(wanted), keys_changed=True)
    assert rotated.action is UserAction.UPDATE and rotated.with_keys
    assert user_sync.request_of(wanted, "n" * 32, rotated).secret_key == "n" * 32
    off = user_sync.wanted_user("billing-app", {**SPEC, "enabled": False})
    step = user_sync.next_user_step(off, held(wanted), keys_changed=False)
    assert step.action is UserAction.UPDATE and "status enable" in step.reason
    assert user_sync.request_of(off, "", step).user_status == "disable"
