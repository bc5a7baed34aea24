"""Users and their ACL policies, durable in one file readable by the broker alone.

The broker checks every call against this table when authentication is on; a master copies
it to its slaves with the topics (replication/state_copy.py), so a promoted slave admits the
same users. It holds secret keys: the request signature is an HMAC the broker must compute,
so the secret itself is kept, in a file of mode 0600.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from capstan.broker.store.atomic_file import JsonConfigTable
from capstan.security.acl import User, UserType

USERS_TABLE_KEY = "users"


def _encode(user: User) -> dict[str, Any]:
    return user.to_document()


def _decode(data: Mapping[str, Any]) -> User:
    return User.from_document(dict(data))


def _name(user: User) -> str:
    return user.name


class UserTable(JsonConfigTable[User]):
    """Every user of a broker, by access key."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, USERS_TABLE_KEY, _encode, _decode, _name, private=True)

    def secret_of(self, access_key: str) -> str | None:
        """The secret key of an enabled user; None for an unknown or disabled one."""
        user = self.get(access_key)
        return user.secret_key if user is not None and user.enabled else None

    def ensure_super_user(self, name: str, secret_key: str) -> bool:
        """Create `name` as an enabled super user unless a user of that name exists; True
        if it was created."""
        if name in self:
            return False
        self.put(User(name, secret_key, UserType.SUPER))
        return True
