"""capstan.v1.Pull: the batch pull of Capstan's own SDK."""
