"""Where a failed message's copy goes and when: the retry level ladder and the DLQ rule."""

from __future__ import annotations

import pytest

from capstan.broker.consumer_groups.send_back import plan_send_back
from capstan.broker.store.message import StoredMessage, pack_host
from capstan.broker.system_topics import DELAY_LEVELS_MS

NOW = 1_000_000


def stored(reconsume_times: int, topic: str = "T", **props: str) -> StoredMessage:
    header = (0, 0, 0, 2, 0, 7, 4096, 0, 1, pack_host("127.0.0.1", 1), 2, pack_host("127.0.0.1", 2))
    raw = "".join(f"{k}\x01{v}\x02" for k, v in props.items()).encode()
    return StoredMessage((*header, reconsume_times, 0, 4), b"body", topic, raw)


@pytest.mark.parametrize("times", range(16))
def test_the_broker_picks_level_three_plus_the_reconsume_times_capped_at_eighteen(times):
    plan = plan_send_back(stored(times), "G", 0, 16, NOW)
    level = min(3 + times, 18)
    assert not plan.dead_letter
    assert plan.message.topic == "%RETRY%G"
    assert plan.message.reconsume_times == times + 1
    assert plan.deliver_at_ms == NOW + DELAY_LEVELS_MS[level - 1]


def test_a_named_level_wins_and_the_real_topic_is_kept_across_retries():
    first = plan_send_back(stored(0, UNIQ_CLIENT_MESSAGE_ID_KEYIDX="id-1"), "G", 1, 16, NOW)
    assert first.deliver_at_ms == NOW + 1000
    props = first.message.properties
    assert (props["RETRY_TOPIC"], props["ORIGIN_MESSAGE_ID"]) == ("T", "id-1")
    again = plan_send_back(stored(1, "%RETRY%G", **props), "G", 2, 16, NOW)
    assert again.message.properties["RETRY_TOPIC"] == "T"
    assert again.message.properties["ORIGIN_MESSAGE_ID"] == "id-1"


def test_dead_letter_once_consumed_the_maximum_or_when_asked():
    assert not plan_send_back(stored(2), "G", 0, 3, NOW).dead_letter
    dead = plan_send_back(stored(3), "G", 0, 3, NOW)
    assert (dead.dead_letter, dead.message.topic, dead.deliver_at_ms) == (True, "%DLQ%G", 0)
    assert dead.message.properties["DLQ_ORIGIN_TOPIC"] == "T"
    assert plan_send_back(stored(0), "G", -1, 16, NOW).dead_letter


@pytest.mark.parametrize("level", [-2, -100])
def test_any_negative_level_asks_for_the_dead_letter_queue(level):
    plan = plan_send_back(stored(0), "G", level, 16, NOW)
    assert (plan.dead_letter, plan.message.topic) == (True, "%DLQ%G")


@pytest.mark.parametrize("level", [19, 100])
def test_a_level_past_the_last_waits_the_last_delay(level):
    plan = plan_send_back(stored(0), "G", level, 16, NOW)
    assert (plan.dead_letter, plan.message.topic) == (False, "%RETRY%G")
    assert plan.deliver_at_ms == NOW + 2 * 3600 * 1000
