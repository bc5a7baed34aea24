"""The apache.rocketmq.v2 messages without the official client behind them.

Capstan takes the protocol's generated modules from the official client's package
(`rocketmq.grpc_protocol`). Python runs a package's `__init__` before any submodule, and
`rocketmq/__init__.py` loads the whole client to re-export it: its producers, consumers,
metrics and OpenTelemetry's exporters, 170 ms of a broker's 970-ms import here (measured
with `python -X importtime`), paid by every broker, controller and CLI process that only
needs the messages.

`defer_client_package` puts the `rocketmq` package in place without running its
`__init__`: its submodules (`rocketmq.grpc_protocol`, `rocketmq.v5...`) import as usual,
and the first attribute asked of the package itself (`from rocketmq import Producer`,
`rocketmq.SimpleConsumer`) runs the `__init__` then, so code using the official client
sees no difference. Nothing happens if `rocketmq` is imported already or is missing.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from typing import Any

PACKAGE = "rocketmq"


def defer_client_package() -> None:
    if PACKAGE in sys.modules:
        return
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return
    module = importlib.util.module_from_spec(spec)  # __path__ set, __init__ not run
    loader = spec.loader
    lock = threading.RLock()
    state = {"loaded": False}

    def load_on_first_use(name: str) -> Any:
        if name.startswith("__") and name.endswith("__") and name != "__all__":
            raise AttributeError(name)  # probes such as __file__ or __wrapped__
        with lock:
            if not state["loaded"]:
                state["loaded"] = True
                del module.__dict__["__getattr__"]
                loader.exec_module(module)
        return getattr(module, name)

    module.__dict__["__getattr__"] = load_on_first_use
    sys.modules[PACKAGE] = module
