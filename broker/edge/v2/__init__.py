"""The `apache.rocketmq.v2.MessagingService` endpoint the official RocketMQ 5 clients use."""
