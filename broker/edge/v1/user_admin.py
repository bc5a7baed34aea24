"""The Admin RPCs that manage users and their ACL policies (super users only: the access
guard lets no normal user reach them).

Secret keys go in (CreateUser, UpdateUser) and never come out: every answer carries the
user without it. A change is saved in the broker's user table and answered once the
in-sync slaves hold it, as topic changes are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from capstan.broker.store.user_table import UserTable
from capstan.common.grpc_abort import abort, require
from capstan.security.acl import (
    AclError,
    PolicyEntry,
    User,
    with_entry,
    without_resources,
)
from capstan.security.peers import CLUSTER_ACCESS_KEY
from capstan.security.policy_wire import entry_document, entry_to_wire
from capstan.v1 import admin_pb2 as pb

Replicated = Callable[[Any, str], Awaitable[None]]


def user_to_wire(user: User) -> pb.User:
    """The user as answered: everything but its secret key."""
    return pb.User(
        username=user.name,
        user_type=user.type.value,
        user_status="enable" if user.enabled else "disable",
        policy=[entry_to_wire(e) for e in user.policy],
    )


def user_from_wire(request: pb.User) -> User:
    return User.from_document(
        {
            "username": request.username,
            "password": request.secret_key,
            "userType": request.user_type or "Normal",
            "userStatus": request.user_status or "enable",
            "policy": [entry_document(e) for e in request.policy],
        }
    )


def _updated(user: User, request: pb.User) -> User:
    changes: dict[str, Any] = {}
    if request.secret_key:
        changes["secret_key"] = request.secret_key
    if request.user_type or request.user_status:
        parsed = User.from_document(
            {
                "username": user.name,
                "password": changes.get("secret_key", user.secret_key),
                "userType": request.user_type or user.type.value,
                "userStatus": request.user_status or ("enable" if user.enabled else "disable"),
            }
        )
        changes.update(type=parsed.type, enabled=parsed.enabled)
    if request.replace_policy:
        given = user_from_wire(
            pb.User(username=user.name, secret_key=user.secret_key, policy=request.policy)
        )
        changes["policy"] = given.policy
    return dataclasses.replace(user, **changes)


class UserAdmin:
    def __init__(self, users: UserTable, replicated: Replicated) -> None:
        self._users = users
        self._replicated = replicated

    async def create(self, request: pb.User, context: Any) -> pb.UserReply:
        user = await self._parsed(context, lambda: user_from_wire(request))
        if user.name == CLUSTER_ACCESS_KEY:
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{CLUSTER_ACCESS_KEY} is the cluster's own identity, not a user name",
            )
        if request.username in self._users:
            await abort(context, grpc.StatusCode.ALREADY_EXISTS, f"user {user.name} exists")
        return await self._saved(context, user, f"user {user.name}")

    async def update(self, request: pb.User, context: Any) -> pb.UserReply:
        user = await self._existing(context, request.username)
        changed = await self._parsed(context, lambda: _updated(user, request))
        return await self._saved(context, changed, f"user {user.name}")

    async def delete(self, request: pb.UserRequest, context: Any) -> pb.DeleteReply:
        await require(context, username=request.username)
        deleted = self._users.delete(request.username)
        if not deleted:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"no user {request.username!r}")
        await self._replicated(context, f"deleting user {request.username}")
        return pb.DeleteReply(deleted=True)

    async def get(self, request: pb.UserRequest, context: Any) -> pb.UserReply:
        return pb.UserReply(user=user_to_wire(await self._existing(context, request.username)))

    async def list(self, request: pb.ListUsersRequest, context: Any) -> pb.ListUsersReply:
        return pb.ListUsersReply(users=[user_to_wire(u) for u in self._users.all()])

    async def create_acl(self, request: pb.AclRequest, context: Any) -> pb.UserReply:
        user = await self._existing(context, request.username)
        doc = entry_document(request.entry)
        changed = await self._parsed(
            context, lambda: with_entry(user, PolicyEntry.from_document(doc))
        )
        return await self._saved(context, changed, f"the ACL of {user.name}")

    async def delete_acl(self, request: pb.DeleteAclRequest, context: Any) -> pb.UserReply:
        user = await self._existing(context, request.username)
        changed = await self._parsed(
            context, lambda: without_resources(user, list(request.resources))
        )
        return await self._saved(context, changed, f"the ACL of {user.name}")

    async def _existing(self, context: Any, name: str) -> User:
        await require(context, username=name)
        user = self._users.get(name)
        if user is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"no user {name!r}")
        return user

    @staticmethod
    async def _parsed(context: Any, build: Callable[[], User]) -> User:
        try:
            return build()
        except AclError as exc:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def _saved(self, context: Any, user: User, what: str) -> pb.UserReply:
        self._users.put(user)
        await self._replicated(context, what)
        return pb.UserReply(user=user_to_wire(user))
