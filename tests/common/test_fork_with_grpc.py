"""A child forked while gRPC calls are in flight starts: PySpark's JVM is started so (a fork
with a preexec_fn) from processes that hold gRPC channels, and gRPC's own fork handlers,
unless Capstan turns them off, kill a few percent of such children at random."""

from __future__ import annotations

import os
import subprocess
import sys

_FORKS_UNDER_CALLS = """
import capstan  # first, as every Capstan process imports it before grpc
import signal, subprocess, threading
from concurrent import futures
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

server = grpc.server(futures.ThreadPoolExecutor(4))
health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
done = threading.Event()

def calls():
    stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    while not done.is_set():
        stub.Check(health_pb2.HealthCheckRequest(), timeout=5)

callers = [threading.Thread(target=calls) for _ in range(3)]
for t in callers:
    t.start()
failed = 0
for _ in range(200):
    child = subprocess.Popen(
        ["sh", "-c", "exit 0"],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        stderr=subprocess.DEVNULL,
    )
    failed += child.wait() != 0
done.set()
for t in callers:
    t.join()
server.stop(0)
print(failed)
"""


def test_children_forked_during_grpc_calls_all_start():
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    done = subprocess.run(
        [sys.executable, "-c", _FORKS_UNDER_CALLS],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "0", f"children died: {done.stdout} {done.stderr[-1000:]}"
