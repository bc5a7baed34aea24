"""Broker YAML settings: every key known, unknown keys named, values checked."""

from __future__ import annotations

import pytest

from capstan.common.broker_settings import BrokerSettings, broker_settings_from_yaml
from capstan.common.errors import ConfigError
from capstan.common.store_settings import FlushMode


def test_defaults_and_nested_sections():
    s = broker_settings_from_yaml(
        "grpc_port: 9000\nstore:\n  flush_mode: ASYNC_FLUSH\npop:\n  min_invisible_ms: 500\n"
    )
    assert s.grpc_port == 9000 and s.http_port == 9100
    assert s.store.flush_mode is FlushMode.ASYNC_FLUSH and s.pop.min_invisible_ms == 500
    assert broker_settings_from_yaml("") == BrokerSettings()


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("grpc_prot: 1", "grpc_prot"),
        ("store:\n  flush_mod: SYNC_FLUSH", "store.flush_mod"),
        ("pop:\n  nope: 1", "pop.nope"),
        ("grpc_port: eighty", "grpc_port"),
        ("store: 5", "store"),
        ("auto_create_topic: yes please", "auto_create_topic"),
        ("- a list", "mapping"),
        ("grpc_port: [", "YAML"),
        ("pop:\n  min_invisible_ms: 99999999", "pop"),
    ],
)
def test_bad_settings_name_the_key(text, named):
    with pytest.raises(ConfigError, match=named):
        broker_settings_from_yaml(text)


def test_every_setting_is_documented():
    import dataclasses
    from pathlib import Path

    from capstan.common.broker_settings import (
        ConsumerGroupSettings,
        PopSettings,
        ReplicationSettings,
        TimerSettings,
        TransactionSettings,
    )
    from capstan.common.security_settings import AuthSettings, TlsSettings
    from capstan.common.store_settings import IndexSettings, StoreSettings

    text = (Path(__file__).parents[2] / "docs" / "broker.md").read_text()
    sections = {
        "": BrokerSettings,
        "pop.": PopSettings,
        "timer.": TimerSettings,
        "transaction.": TransactionSettings,
        "consumer_groups.": ConsumerGroupSettings,
        "replication.": ReplicationSettings,
        "auth.": AuthSettings,
        "tls.": TlsSettings,
        "store.": StoreSettings,
        "store.index.": IndexSettings,
    }
    nested = {
        "store", "pop", "timer", "transaction", "consumer_groups", "index", "replication", "auth",
        "tls",
    }  # fmt: skip
    missing = [
        f"{prefix}{f.name}"
        for prefix, cls in sections.items()
        for f in dataclasses.fields(cls)
        if f.name not in nested and f"`{prefix}{f.name}`" not in text
    ]
    assert missing == []


def test_set_overrides_take_the_files_types_and_sections(tmp_path):
    from capstan.common.broker_settings import load_broker_settings

    config = tmp_path / "broker.yaml"
    config.write_text("broker_name: a\nstore:\n  flush_interval_ms: 100\n")
    s = load_broker_settings(
        config,
        [
            "listen_host=127.0.0.7",
            "grpc_port=9001",
            "store.flush_mode=ASYNC_FLUSH",
            "pop.max_batch_size=4",
            "advertised_host=b-0.b-brokers.ns.svc",
        ],
    )
    assert (s.broker_name, s.listen_host, s.grpc_port) == ("a", "127.0.0.7", 9001)
    assert s.store.flush_mode is FlushMode.ASYNC_FLUSH and s.store.flush_interval_ms == 100
    assert s.pop.max_batch_size == 4 and s.advertised_host == "b-0.b-brokers.ns.svc"
    assert load_broker_settings(None, ["grpc_port=1"]).grpc_port == 1


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("grpc_port", "expected key=value"),
        ("grpc_port=eighty", "grpc_port"),
        ("stor.flush_mode=ASYNC_FLUSH", "stor"),
        ("broker_name.x=1", "broker_name"),
    ],
)
def test_a_bad_override_names_what_is_wrong(override, named):
    from capstan.common.broker_settings import load_broker_settings

    with pytest.raises(ConfigError, match=named):
        load_broker_settings(None, [override])
