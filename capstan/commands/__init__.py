"""The `capstan` subcommands, one module per area; `capstan.cli` assembles them."""
