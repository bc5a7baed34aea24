"""What each Capstan gRPC server serves, said two ways.

- The standard gRPC server reflection service lists the services of a server, so a client
  (the CLI, grpcurl) can tell a broker from the controller and say which one it reached.
- A method a servicer does not implement answers UNIMPLEMENTED with one line naming the
  method and who serves it. The generated base classes raise NotImplementedError instead,
  which grpc logs with a traceback for every such call.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc
from grpc_reflection.v1alpha import reflection

HEALTH = "grpc.health.v1.Health"
REFLECTION = str(reflection.SERVICE_NAME)
MESSAGING = "apache.rocketmq.v2.MessagingService"
ADMIN = "capstan.v1.Admin"
PULL = "capstan.v1.Pull"
CONSUMER = "capstan.v1.Consumer"
REPLICATION = "capstan.v1.Replication"
REPLICA_PEERS = "capstan.v1.ReplicaPeers"
CONTROLLER = "capstan.v1.Controller"

BROKER_SERVICES = (MESSAGING, ADMIN, PULL, CONSUMER, REPLICATION, REPLICA_PEERS, HEALTH)
CONTROLLER_SERVICES = (CONTROLLER, MESSAGING, ADMIN, HEALTH)

T = TypeVar("T", bound=type)


def announce(server: grpc.aio.Server, services: Sequence[str]) -> None:
    """Serve reflection on `server`, listing `services` (and reflection itself)."""
    reflection.enable_server_reflection([*services, REFLECTION], server)


def service_name(servicer_base: type) -> str:
    """The full name of the service whose generated `<Name>Servicer` is `servicer_base`."""
    module: Any = importlib.import_module(servicer_base.__module__.removesuffix("_grpc"))
    short = servicer_base.__name__.removesuffix("Servicer")
    return str(module.DESCRIPTOR.services_by_name[short].full_name)


def unserved_methods(servicer: type, base: type) -> list[str]:
    """The RPCs of the generated `base` that `servicer` (a subclass) leaves to it."""
    return [
        name
        for name, value in vars(base).items()
        if not name.startswith("_") and callable(value) and getattr(servicer, name) is value
    ]


def unserved_detail(service: str, method: str, where: str, instead: str = "") -> str:
    """`<service>/<method> is not served by <where>[; <instead>]`."""
    text = f"{service}/{method} is not served by {where}"
    return f"{text}; {instead}" if instead else text


def refusal(detail: str) -> Callable[..., Any]:
    """An RPC handler of any kind (unary or streaming) that answers UNIMPLEMENTED."""

    async def refuse(self: Any, request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, detail)

    return refuse


def answer_unimplemented(where: str, instead: str = "") -> Callable[[T], T]:
    """A class decorator for a servicer: every RPC of its generated base that it does not
    implement answers UNIMPLEMENTED, naming the method, `where` it was called (say "the
    Capstan controller") and, as `instead`, who serves it."""

    def decorate(cls: T) -> T:
        base = _generated_base(cls)
        service = service_name(base)
        for name in unserved_methods(cls, base):
            setattr(cls, name, refusal(unserved_detail(service, name, where, instead)))
        return cls

    return decorate


def _generated_base(cls: type) -> type:
    for klass in cls.__mro__[1:]:
        if klass.__module__.endswith("_pb2_grpc"):
            return klass
    raise TypeError(f"{cls.__name__} does not derive from a generated gRPC servicer")
