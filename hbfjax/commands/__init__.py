"""One module per ``hbfjax`` subcommand; each exposes ``register(subparsers)``."""
