"""The bottom layer: errors, settings loading and helpers every component shares."""
