"""The two kinds of errors users see: a bad configuration and bad input tensors."""


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type or impossible; the message names the key and the fix."""


class InputError(ValueError):
    """Input tensors do not fit together (lengths, missing keys, non-finite values); the message names the field."""


class StateError(RuntimeError):
    """A controller state file is missing, corrupt or does not match the configuration; the message names the file."""
