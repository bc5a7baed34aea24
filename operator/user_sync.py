"""What a CapstanUser asks of each BrokerGroup, and the one step that brings a broker
group's copy of the user there (pure: the handlers in user_handlers.py carry it out).

The resource wins: a user created or changed on the brokers by other means (`capstan user`)
under the same name is set back to what the resource says, policy and all, in one
UpdateUser (`replace_policy`), so there is no moment with half a policy.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from capstan.security.acl import AclError, PolicyEntry, User, UserType
from capstan.security.policy_wire import entry_document, entry_to_wire
from capstan.v1 import admin_pb2 as pb

USER_SECRET_PREFIX = "capstan-user-"


def user_secret(resource_name: str) -> str:
    """The Secret holding a CapstanUser's keys (prefixed: a user named `admin` must not
    take the namespace's `capstan-admin`)."""
    return f"{USER_SECRET_PREFIX}{resource_name}"


@dataclass(frozen=True)
class WantedUser:
    name: str
    user_type: UserType
    enabled: bool
    policy: tuple[PolicyEntry, ...]


def wanted_user(resource_name: str, spec: Mapping[str, Any]) -> WantedUser:
    """The user `spec` describes; AclError naming what is wrong (the field's index)."""
    name = str(spec.get("userName") or resource_name)
    entries = []
    for i, doc in enumerate(spec.get("acl") or ()):
        try:
            entries.append(PolicyEntry.from_document(dict(doc)))
        except (AclError, TypeError, ValueError) as exc:
            raise AclError(f"spec.acl[{i}]: {exc}") from None
    user_type = UserType.SUPER if spec.get("userType") == "Super" else UserType.NORMAL
    # The user name's own rule (letters, digits, . _ -, 1 to 64), checked as the broker will.
    User(name, "x" * 32, user_type)
    return WantedUser(name, user_type, bool(spec.get("enabled", True)), tuple(entries))


class UserAction(enum.Enum):
    CREATE = "create"
    UPDATE = "update"
    IN_SYNC = "in-sync"


@dataclass(frozen=True)
class UserStep:
    action: UserAction
    reason: str
    with_keys: bool
    """The request carries the secret key (a new user, or keys that changed)."""


def next_user_step(wanted: WantedUser, found: pb.User | None, keys_changed: bool) -> UserStep:
    """What to do on one broker group that holds `found` (None: no such user)."""
    if found is None or not found.username:
        return UserStep(UserAction.CREATE, "the user is not there", True)
    drift = []
    if (found.user_type or "Normal") != wanted.user_type.value:
        drift.append(f"type {found.user_type or 'Normal'}")
    if (found.user_status or "enable") != ("enable" if wanted.enabled else "disable"):
        drift.append(f"status {found.user_status or 'enable'}")
    try:
        held = tuple(PolicyEntry.from_document(entry_document(e)) for e in found.policy)
    except AclError:
        held = ()
        drift.append("an unreadable policy")
    else:
        if held != wanted.policy:
            drift.append("its policy")
    if keys_changed:
        drift.append("its keys")
    if not drift:
        return UserStep(UserAction.IN_SYNC, "", False)
    return UserStep(UserAction.UPDATE, "differs in " + ", ".join(drift), keys_changed)


def request_of(wanted: WantedUser, secret_key: str, step: UserStep) -> pb.User:
    """The CreateUser or UpdateUser request of `step` (the whole policy either way)."""
    return pb.User(
        username=wanted.name,
        secret_key=secret_key if step.with_keys else "",
        user_type=wanted.user_type.value,
        user_status="enable" if wanted.enabled else "disable",
        policy=[entry_to_wire(e) for e in wanted.policy],
        replace_policy=step.action is UserAction.UPDATE,
    )
