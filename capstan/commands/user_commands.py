"""`capstan user …` and `capstan acl …`: users and their ACL policies (capstan.v1 Admin,
super users only once authentication is on). Through the controller, the default
`--server`, every broker group gets the change; through one broker, its group alone.

A user's secret key is given with `--user-secret`, or made up and printed once when left
out; no command shows it again.
"""

from __future__ import annotations

import argparse
import secrets
from typing import Any

from capstan.commands import reach
from capstan.commands.admin_commands import (
    ASK_EVERY_GROUP,
    ON_EVERY_GROUP,
    SubParsers,
    admin_call,
)
from capstan.commands.output import dump, json_flag, print_json, width
from capstan.v1 import admin_pb2 as pb

USER_TYPES = ("Super", "Normal")
STATUSES = ("enable", "disable")
SECRET_BYTES = 24
"""Random bytes of a made-up secret key (32 characters of URL-safe base64)."""


def add_parsers(commands: SubParsers) -> None:
    _add_user_parsers(commands)
    _add_acl_parsers(commands)


def _add_user_parsers(commands: SubParsers) -> None:
    user = commands.add_parser("user", help="create, change, delete and list users")
    users = user.add_subparsers(dest="user_command", required=True)
    p = users.add_parser("create", help="create a user (its name is its access key)")
    p.add_argument("name")
    p.add_argument("--user-secret", help="its secret key (default: made up and printed once)")
    p.add_argument("--type", choices=USER_TYPES, default="Normal", type=str.capitalize)
    _finish(p, ON_EVERY_GROUP, _user_create)
    p = users.add_parser("update", help="change a user's secret key, type or status")
    p.add_argument("name")
    p.add_argument("--user-secret", help="a new secret key")
    p.add_argument("--type", choices=USER_TYPES, type=str.capitalize)
    p.add_argument("--status", choices=STATUSES, type=str.lower)
    _finish(p, ON_EVERY_GROUP, _user_update)
    p = users.add_parser("delete", help="delete a user")
    p.add_argument("name")
    _finish(p, ON_EVERY_GROUP, _user_delete)
    p = users.add_parser("get", help="a user and its policy")
    p.add_argument("name")
    _finish(p, ASK_EVERY_GROUP, _user_get)
    p = users.add_parser("list", help="list users")
    _finish(p, ASK_EVERY_GROUP, _user_list)


def _add_acl_parsers(commands: SubParsers) -> None:
    acl = commands.add_parser("acl", help="grant, deny and list what users may do")
    acls = acl.add_subparsers(dest="acl_command", required=True)
    p = acls.add_parser(
        "create",
        help="add an entry to a user's policy; it replaces what the policy said about the "
        "resources it names",
    )
    p.add_argument("user")
    p.add_argument(
        "--resource",
        action="append",
        required=True,
        help="Topic:NAME, Topic:PREFIX*, Group:NAME, Cluster:NAME, or * (repeatable)",
    )
    p.add_argument(
        "--action",
        action="append",
        required=True,
        help="Pub, Sub, Create, Update, Delete, Get, List or All (repeatable, or comma-separated)",
    )
    p.add_argument("--decision", choices=("Allow", "Deny"), default="Allow", type=str.capitalize)
    p.add_argument(
        "--source-ip", action="append", default=[], help="an address or CIDR (repeatable)"
    )
    _finish(p, ON_EVERY_GROUP, _acl_create)
    p = acls.add_parser("delete", help="take resources (default: all) out of a user's policy")
    p.add_argument("user")
    p.add_argument("--resource", action="append", default=[], help="repeatable")
    _finish(p, ON_EVERY_GROUP, _acl_delete)
    p = acls.add_parser("list", help="every user's policy entries, one row each")
    p.add_argument("--user", help="one user's entries only")
    _finish(p, ASK_EVERY_GROUP, _acl_list)


def _finish(p: argparse.ArgumentParser, where: str, run: Any) -> None:
    reach.add_server(p, where)
    json_flag(p)
    p.set_defaults(run=run)


# -- users ----------------------------------------------------------------------------------


def _user_document(user: pb.User) -> dict[str, Any]:
    doc = dump(user)
    doc.pop("secret_key", None)
    doc.setdefault("policy", [])
    return doc


def _print_user(user: pb.User, as_json: bool, extra: dict[str, Any] | None = None) -> None:
    if as_json:
        print_json({**_user_document(user), **(extra or {})})
        return
    print(f"{user.username}: {user.user_type}, {user.user_status}, {len(user.policy)} entries")
    for entry in user.policy:
        print(f"  {_entry_line(entry)}")


def _user_create(args: argparse.Namespace) -> int:
    made_up = not args.user_secret
    secret = args.user_secret or secrets.token_urlsafe(SECRET_BYTES)
    request = pb.User(username=args.name, secret_key=secret, user_type=args.type)
    reply = admin_call(args, lambda a: a.create_user(request))
    extra = {"secret_key": secret} if made_up else None
    _print_user(reply.user, args.json, extra)
    if made_up and not args.json:
        print(f"secret key (shown once): {secret}")
    return 0


def _user_update(args: argparse.Namespace) -> int:
    request = pb.User(
        username=args.name,
        secret_key=args.user_secret or "",
        user_type=args.type or "",
        user_status=args.status or "",
    )
    reply = admin_call(args, lambda a: a.update_user(request))
    _print_user(reply.user, args.json)
    return 0


def _user_delete(args: argparse.Namespace) -> int:
    admin_call(args, lambda a: a.delete_user(args.name))
    if args.json:
        print_json({"username": args.name, "deleted": True})
    else:
        print(f"deleted user {args.name}")
    return 0


def _user_get(args: argparse.Namespace) -> int:
    _print_user(admin_call(args, lambda a: a.get_user(args.name)).user, args.json)
    return 0


def _user_list(args: argparse.Namespace) -> int:
    users = list(admin_call(args, lambda a: a.list_users()).users)
    if args.json:
        print_json({"users": [_user_document(u) for u in users]})
        return 0
    w = width("USER", (u.username for u in users))
    print(f"{'USER':<{w}}  {'TYPE':<6}  {'STATUS':<7}  ENTRIES")
    for u in users:
        print(f"{u.username:<{w}}  {u.user_type:<6}  {u.user_status:<7}  {len(u.policy)}")
    return 0


# -- ACLs -----------------------------------------------------------------------------------


def _entry_line(entry: pb.PolicyEntry) -> str:
    sources = f" from {', '.join(entry.source_ips)}" if entry.source_ips else ""
    return f"{entry.decision} {','.join(entry.actions)} on {', '.join(entry.resources)}{sources}"


def _acl_create(args: argparse.Namespace) -> int:
    actions = [a.strip() for given in args.action for a in given.split(",") if a.strip()]
    entry = pb.PolicyEntry(
        resources=args.resource,
        actions=actions,
        decision=args.decision,
        source_ips=args.source_ip,
    )
    reply = admin_call(args, lambda a: a.create_acl(args.user, entry))
    _print_user(reply.user, args.json)
    return 0


def _acl_delete(args: argparse.Namespace) -> int:
    reply = admin_call(args, lambda a: a.delete_acl(args.user, args.resource))
    _print_user(reply.user, args.json)
    return 0


def _acl_list(args: argparse.Namespace) -> int:
    if args.user:
        users = [admin_call(args, lambda a: a.get_user(args.user)).user]
    else:
        users = list(admin_call(args, lambda a: a.list_users()).users)
    rows = [{"user": u.username, **dump(e)} for u in users for e in u.policy]
    if args.json:
        print_json({"entries": rows})
        return 0
    w = width("USER", (r["user"] for r in rows))
    print(f"{'USER':<{w}}  ENTRY")
    for u in users:
        for e in u.policy:
            print(f"{u.username:<{w}}  {_entry_line(e)}")
    return 0
