"""Looking up topics and consumer groups, creating them on first use where allowed.

Every caller that names a topic or group by what a client sent goes through here, so the
auto-create rules live in one place: a group's own retry and dead-letter topics always
exist once named, other topics only with `auto_create_topic` (never a system topic), and
groups only with `auto_create_group`.
"""

from __future__ import annotations

import logging

from capstan.broker.store.subscription_groups import SubscriptionGroupConfig, SubscriptionGroupStore
from capstan.broker.store.topic_config import TopicConfig, TopicConfigStore
from capstan.broker.system_topics import group_topic_config, is_group_topic, is_system_topic
from capstan.common.broker_settings import BrokerSettings

log = logging.getLogger(__name__)


class Catalog:
    def __init__(
        self,
        topics: TopicConfigStore,
        groups: SubscriptionGroupStore,
        settings: BrokerSettings,
    ) -> None:
        self.topics = topics
        self.groups = groups
        self._auto_topics = settings.auto_create_topic
        self._auto_groups = settings.auto_create_group
        self._default_queues = settings.default_queue_nums

    def topic(self, name: str, create: bool = False) -> TopicConfig | None:
        """A topic's config; auto-created when allowed (never for system topics)."""
        config = self.topics.get(name)
        if config is not None:
            return config
        if is_group_topic(name):
            config = group_topic_config(name)
        elif create and self._auto_topics and not is_system_topic(name):
            config = TopicConfig(name, self._default_queues, self._default_queues)
            log.info("auto-created topic %s with %d queues", name, self._default_queues)
        else:
            return None
        self.topics.put(config)
        return config

    def group(self, name: str) -> SubscriptionGroupConfig | None:
        """A consumer group's config; auto-created when allowed."""
        config = self.groups.get(name)
        if config is None and self._auto_groups:
            config = SubscriptionGroupConfig(name)
            self.groups.put(config)
            log.info("auto-created consumer group %s", name)
        return config
