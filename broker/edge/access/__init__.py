"""Who may call the broker: each call authenticated by its signature and authorized by
its user's policy (guard.py), with what each RPC needs written per service
(v2_grants.py, v1_grants.py)."""
