"""Authentication settings, shared by the broker and the controller."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AuthSettings:
    """Who may call: the RocketMQ 5 request signature, users and ACL policies."""

    enabled: bool = False
    """Check every client call's signature against the broker's users and their policies.
    Default false (open, for local development)."""

    max_clock_skew_s: float = 900.0
    """How far a call's signed time may be from the broker's clock, either way, in seconds.
    Default 900."""

    init_user_file: str = ""
    """A JSON file `{"access_key": ..., "secret_key": ...}` naming the first super user: it
    is created at start when no user of that name exists. Default empty: none."""

    def __post_init__(self) -> None:
        if not 0 < self.max_clock_skew_s <= 86_400:
            raise ValueError("auth.max_clock_skew_s must be within (0, 86400] seconds")
