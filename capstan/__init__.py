"""Capstan: a RocketMQ-style distributed message queue in Python, operated on Kubernetes.

The import namespace `capstan` maps onto the repository's top-level folders
(`capstan.broker` is `broker/`, `capstan.operator` is `operator/`, ...); see pyproject.toml.
"""

__version__ = "0.1.0"
