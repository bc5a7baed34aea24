"""Receive/ack consumption: in-flight messages, receipt handles, redelivery, dead letters."""
