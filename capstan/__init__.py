"""Capstan: a RocketMQ-style distributed message queue in Python, operated on Kubernetes.

The import namespace `capstan` maps onto the repository's top-level folders
(`capstan.broker` is `broker/`, `capstan.operator` is `operator/`, ...); see pyproject.toml.
"""

__version__ = "0.1.0"

import os as _os

# gRPC's own fork handlers (on in grpcio's core unless this says otherwise) can kill a child
# forked while other threads are in gRPC calls: PySpark's JVM, or any Popen with a
# preexec_fn. Measured here: 9 and 10 of 300 such children died with calls in flight, 0 of
# 300 with the handlers off. Capstan never uses gRPC in a forked child, so they are off
# unless the environment says otherwise. Read when grpc is imported: keep this before it.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

# The official client's package without its client until something asks for it: brokers and
# controllers need only its protocol modules (capstan/common/v2_protocol_import.py).
from capstan.common.v2_protocol_import import defer_client_package as _defer_client_package

_defer_client_package()
