"""Fixtures shared by the operator's tests: `broker`, one broker process alone for the
operator's admin calls to reach, is the broker tests' own."""

from tests.broker.conftest import broker

__all__ = ["broker"]
