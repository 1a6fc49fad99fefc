"""One module per ``gpufold`` subcommand (or group); each exposes ``register(subparsers)``."""
