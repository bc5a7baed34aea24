"""What Capstan shares about talking to Kubernetes itself (the API client, not kopf)."""
