"""The tools in tests/ that run Capstan in a process of its own and talk to it over
127.0.0.1: a broker, a controller, `capstan up`, the CLI against a server, an SDK consumer.

Each declares itself with `@process_tool`; tests/conftest.py marks `integration` every test
that reaches one (see there for the rule)."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")

_FLAG = "__capstan_process_tool__"


def process_tool(tool: T) -> T:
    """Declare a class or function of tests/ that starts such a process."""
    setattr(tool, _FLAG, True)
    return tool


def is_process_tool(thing: object) -> bool:
    return getattr(thing, _FLAG, False) is True
