"""Who may call Capstan: the RocketMQ 5 request signature, users and ACL 2.0 policies, and
the TLS material every endpoint and channel is built from."""
