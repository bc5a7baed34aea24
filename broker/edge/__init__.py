"""The broker's protocol edge: every gRPC servicer clients call, and nothing else.

`v2` speaks `apache.rocketmq.v2` to the official clients, `v1` the capstan.v1 services of
Capstan's own SDK and CLI. Servicers turn requests into calls on the broker's services and
their answers into replies; the services and the store below never see a protobuf of
either protocol (an import-linter contract in pyproject.toml keeps it so).
"""
