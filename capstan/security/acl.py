"""Users and ACL 2.0 policies, and the pure decision whether a user may do what a call does.

The model of RocketMQ 5's ACL 2.0:

- A user is an access key (its name) with a secret key; a super user may do anything, a
  normal user what its policy allows. A disabled user is refused like an unknown one.
- A policy is a list of entries. An entry names resources (`Topic:orders` exactly,
  `Topic:orders-*` by prefix, `Topic:*` or `*` for every one), actions (Pub, Sub, Create,
  Update, Delete, Get, List, or All), a decision (Allow or Deny) and, optionally, the source
  networks it holds for (CIDRs).
- A call needs one or more grants: each a resource and the actions any one of which will
  do (a route lookup needs Pub or Sub on its topic; a receive needs Sub on its topic and on
  its group). A grant is refused if any matching entry denies it (deny wins), and given if
  some matching entry allows it; with no matching entry it is refused.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from capstan.common.errors import ConfigError


class AclError(ConfigError):
    """A user or policy document that cannot be taken as it is; says what is wrong."""


class ResourceType(Enum):
    CLUSTER = "Cluster"
    TOPIC = "Topic"
    GROUP = "Group"


class Action(Enum):
    PUB = "Pub"
    SUB = "Sub"
    CREATE = "Create"
    UPDATE = "Update"
    DELETE = "Delete"
    GET = "Get"
    LIST = "List"
    ALL = "All"


class Decision(Enum):
    ALLOW = "Allow"
    DENY = "Deny"


class UserType(Enum):
    SUPER = "Super"
    NORMAL = "Normal"


def _named(enum: type[Enum], text: Any, what: str) -> Any:
    for member in enum:
        if isinstance(text, str) and member.value.lower() == text.strip().lower():
            return member
    choices = ", ".join(m.value for m in enum)
    raise AclError(f"{what} must be one of {choices}, not {text!r}")


@dataclass(frozen=True, slots=True)
class Resource:
    """What one call touches."""

    type: ResourceType
    name: str

    def __str__(self) -> str:
        return f"{self.type.value}:{self.name}"


@dataclass(frozen=True, slots=True)
class ResourcePattern:
    """`Topic:orders`, `Topic:orders-*`, `Topic:*`, or `*` (type None: every resource)."""

    type: ResourceType | None
    name: str = ""
    prefix: bool = False

    @classmethod
    def parse(cls, text: Any) -> ResourcePattern:
        if not isinstance(text, str) or not text.strip():
            raise AclError(f"a resource must read like Topic:orders, not {text!r}")
        text = text.strip()
        if text == "*":
            return cls(None, "", True)
        kind, colon, name = text.partition(":")
        if not colon or not name:
            raise AclError(f"a resource must read like Topic:orders or Group:b-*, not {text!r}")
        rtype = _named(ResourceType, kind, "a resource type")
        if name.endswith("*"):
            return cls(rtype, name[:-1], True)
        if "*" in name:
            raise AclError(f"'*' may only end a resource name: {text!r}")
        return cls(rtype, name)

    def matches(self, resource: Resource) -> bool:
        if self.type is not None and self.type is not resource.type:
            return False
        if self.prefix:
            return resource.name.startswith(self.name)
        return resource.name == self.name

    def __str__(self) -> str:
        if self.type is None:
            return "*"
        return f"{self.type.value}:{self.name}{'*' if self.prefix else ''}"


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class PolicyEntry:
    resources: tuple[ResourcePattern, ...]
    actions: frozenset[Action]
    decision: Decision
    source_networks: tuple[Network, ...] = ()

    @classmethod
    def from_document(cls, doc: Any) -> PolicyEntry:
        if not isinstance(doc, dict):
            raise AclError(f"a policy entry must be a mapping, not {type(doc).__name__}")
        unknown = set(doc) - {"resources", "actions", "decision", "sourceIps"}
        if unknown:
            raise AclError(f"a policy entry has unknown fields: {', '.join(sorted(unknown))}")
        resources = _listed(doc.get("resources"), "resources")
        actions = _listed(doc.get("actions"), "actions")
        return cls(
            tuple(ResourcePattern.parse(r) for r in resources),
            frozenset(_named(Action, a, "an action") for a in actions),
            _named(Decision, doc.get("decision", "Allow"), "a decision"),
            tuple(_network(ip) for ip in doc.get("sourceIps") or ()),
        )

    def to_document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "resources": [str(r) for r in self.resources],
            "actions": sorted(a.value for a in self.actions),
            "decision": self.decision.value,
        }
        if self.source_networks:
            doc["sourceIps"] = [str(n) for n in self.source_networks]
        return doc

    def covers(self, resource: Resource, actions: frozenset[Action], source: str | None) -> bool:
        if not any(p.matches(resource) for p in self.resources):
            return False
        if Action.ALL not in self.actions and not self.actions & actions:
            return False
        return not self.source_networks or _from(source, self.source_networks)


def _listed(value: Any, what: str) -> list[Any]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise AclError(f"a policy entry needs {what}: a non-empty list")
    return value


def _network(text: Any) -> Network:
    try:
        return ipaddress.ip_network(str(text).strip(), strict=False)
    except ValueError:
        raise AclError(f"a source must be an address or a CIDR, not {text!r}") from None


def _from(source: str | None, networks: Sequence[Network]) -> bool:
    if not source:
        return False
    try:
        address = ipaddress.ip_address(source)
    except ValueError:
        return False
    return any(address in n for n in networks)


USER_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
MAX_SECRET_CHARS = 256


@dataclass(frozen=True, slots=True)
class User:
    """A user (its access key is its name) and its policy."""

    name: str
    secret_key: str = field(repr=False)
    type: UserType = UserType.NORMAL
    enabled: bool = True
    policy: tuple[PolicyEntry, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not USER_NAME.fullmatch(self.name):
            raise AclError(
                f"a user name must be 1 to 64 letters, digits, '.', '_' or '-', not {self.name!r}"
            )
        if (
            not isinstance(self.secret_key, str)
            or not 6 <= len(self.secret_key) <= MAX_SECRET_CHARS
        ):
            raise AclError(f"the secret key of {self.name} must be 6 to 256 characters")

    @property
    def is_super(self) -> bool:
        return self.type is UserType.SUPER

    def to_document(self, with_secret: bool = True) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "username": self.name,
            "userType": self.type.value,
            "userStatus": "enable" if self.enabled else "disable",
            "policy": [e.to_document() for e in self.policy],
        }
        if with_secret:
            doc["password"] = self.secret_key
        return doc

    @classmethod
    def from_document(cls, doc: Any) -> User:
        if not isinstance(doc, dict):
            raise AclError(f"a user must be a mapping, not {type(doc).__name__}")
        unknown = set(doc) - {"username", "password", "userType", "userStatus", "policy"}
        if unknown:
            raise AclError(f"a user has unknown fields: {', '.join(sorted(unknown))}")
        status = doc.get("userStatus", "enable")
        if status not in ("enable", "disable"):
            raise AclError(f"userStatus must be enable or disable, not {status!r}")
        policy = doc.get("policy") or []
        if not isinstance(policy, list):
            raise AclError("a user's policy must be a list of entries")
        return cls(
            doc.get("username", ""),
            doc.get("password", ""),
            _named(UserType, doc.get("userType", "Normal"), "userType"),
            status == "enable",
            tuple(PolicyEntry.from_document(e) for e in policy),
        )


@dataclass(frozen=True, slots=True)
class Grant:
    """One thing a call needs: any one of `actions` on `resource`."""

    resource: Resource
    actions: frozenset[Action]

    def __str__(self) -> str:
        return f"{'|'.join(sorted(a.value for a in self.actions))} on {self.resource}"


def grant(rtype: ResourceType, name: str, *actions: Action) -> Grant:
    return Grant(Resource(rtype, name), frozenset(actions))


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    refused: Grant | None = None
    reason: str = ""


ALLOWED = Verdict(True)


def decide(user: User, needs: Sequence[Grant], source: str | None) -> Verdict:
    """Whether `user`, calling from `source`, holds every grant in `needs`."""
    if user.is_super:
        return ALLOWED
    entries = user.policy
    for need in needs:
        matching = [e for e in entries if e.covers(need.resource, need.actions, source)]
        if any(e.decision is Decision.DENY for e in matching):
            return Verdict(False, need, "denied by a policy")
        if not matching:
            return Verdict(False, need, "no policy allows it")
    return ALLOWED


def with_entry(user: User, entry: PolicyEntry) -> User:
    """`user` with `entry` added; the resources it names are first taken out of the entries
    that named them, so it replaces what the policy said about them."""
    kept = without_resources(user, [str(r) for r in entry.resources]).policy
    return dataclasses.replace(user, policy=(*kept, entry))


def without_resources(user: User, resources: Sequence[str]) -> User:
    """`user` with `resources` taken out of every entry (an entry left with none goes);
    with no resources named, with no policy at all."""
    if not resources:
        return dataclasses.replace(user, policy=())
    gone = {str(ResourcePattern.parse(r)) for r in resources}
    policy = []
    for entry in user.policy:
        left = tuple(r for r in entry.resources if str(r) not in gone)
        if left:
            policy.append(dataclasses.replace(entry, resources=left))
    return dataclasses.replace(user, policy=tuple(policy))
