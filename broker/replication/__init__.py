"""Master-replica replication: epoch history, log reconciliation and write acknowledgement."""
