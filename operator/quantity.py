"""Kubernetes storage quantities ("10Gi", "500M", "1.5Ti") as bytes, to compare a claim's
size with the one a BrokerGroup asks for. Only the forms the CRD's pattern admits and the
API server writes back for storage: a decimal number with an optional binary (Ki..Ei) or
decimal (k..E) suffix."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_FORM = re.compile(r"([0-9]+(?:\.[0-9]+)?)([KMGTPE]i|[kMGTPE])?")
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"k": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}


class QuantityError(ValueError):
    pass


def size_in_bytes(text: str) -> int:
    """Bytes in a storage quantity, rounded up to a whole byte."""
    found = _FORM.fullmatch(str(text).strip())
    if found is None:
        raise QuantityError(f"{text!r} is not a storage size such as 10Gi or 500M")
    number, suffix = found.groups()
    try:
        value = Decimal(number)
    except InvalidOperation:  # the pattern admits only numbers; kept for safety
        raise QuantityError(f"{text!r} is not a number") from None
    if suffix in _BINARY:
        value *= Decimal(1024) ** _BINARY[suffix]
    elif suffix in _DECIMAL:
        value *= Decimal(1000) ** _DECIMAL[suffix]
    whole = int(value)
    return whole if whole == value else whole + 1
