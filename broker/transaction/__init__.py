"""Transactional messages: half and op topics, commit/rollback, check-back."""
