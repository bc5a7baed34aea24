"""What every command prints: with `--json`, exactly one JSON object on stdout with
snake_case keys (lists under a named key), so a script reads any command the same way;
a failure is one `error: …` line on stderr and exit code 1, never a traceback."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict


class CommandError(Exception):
    """A failed command: printed as `error: …`, exit code 1."""


def run_guarded(run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        return run(args)
    except CommandError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object (snake_case keys)"
    )


def width(header: str, values: Iterable[str]) -> int:
    """A table column as wide as its header and its widest value."""
    return max([len(header), *(len(v) for v in values)])


def print_json(document: dict[str, Any]) -> None:
    print(json.dumps(document, default=str), flush=True)


def dump(message: Any) -> dict[str, Any]:
    """A protobuf message as JSON-ready data under its proto field names, with 64-bit
    integers as numbers (protobuf's JSON mapping writes them as strings, which scripts
    then have to convert)."""
    data = MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _int64_as_numbers(message.DESCRIPTOR, data)
    return data


_INT64_TYPES = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
}


def _int64_as_numbers(descriptor: Any, data: dict[str, Any]) -> None:
    for field in descriptor.fields:
        value = data.get(field.name)
        if value is None:
            continue
        if field.type in _INT64_TYPES:
            data[field.name] = [int(v) for v in value] if isinstance(value, list) else int(value)
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            for item in value if isinstance(value, list) else [value]:
                _int64_as_numbers(field.message_type, item)
