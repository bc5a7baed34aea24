"""How Capstan's clients notice a server that stopped answering, and what its servers allow.

A broker that is stopped (SIGSTOP, a hung host, a node cut off) keeps its connections
open: a call waiting on it (a long-polling pull, a member watch) would wait for its own
deadline, 20 s for a pull. The SDK's channels therefore ping a connection every
`CLIENT_PING_MS` while a call is open on it and count it dead when a ping goes unanswered
for `CLIENT_PING_TIMEOUT_MS`: every call on it fails UNAVAILABLE within about 3 s, and the
consumer moves to another replica of the group. Capstan's servers accept pings that often
(a gRPC server's default answers pings more often than every 5 minutes with GOAWAY
too_many_pings); clients that ping rarely, such as the official ones, are unaffected.
"""

from __future__ import annotations

CLIENT_PING_MS = 2_000
"""How often the SDK pings a connection with a call open on it, in milliseconds."""
CLIENT_PING_TIMEOUT_MS = 1_000
"""How long a ping may go unanswered before the connection counts as dead, in milliseconds."""

CLIENT_OPTIONS: list[tuple[str, int]] = [
    ("grpc.keepalive_time_ms", CLIENT_PING_MS),
    ("grpc.keepalive_timeout_ms", CLIENT_PING_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 0),
    # gRPC stops pinging after two pings with no data between them, and spaces pings by
    # 5 minutes, unless told otherwise; a long poll sends no data for seconds.
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.min_time_between_pings_ms", CLIENT_PING_MS),
    # What ends a connection whose ping goes unanswered in this gRPC (keepalive_timeout_ms
    # alone let a call on a stopped server wait for its own deadline; measured).
    ("grpc.http2.ping_timeout_ms", CLIENT_PING_TIMEOUT_MS),
]
"""gRPC channel options of the SDK's channels."""

SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.http2.min_ping_interval_without_data_ms", CLIENT_PING_MS // 2),
    ("grpc.http2.max_ping_strikes", 0),  # pings too early are ignored, never a GOAWAY
]
"""gRPC server options of the broker and the controller: accept the SDK's pings."""
