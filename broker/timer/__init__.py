"""Delayed delivery: a persistent timer over the timer topic."""
