"""The project's error types. Each message names the problem and the fix; the command-line
programs turn any `SaConvError` into exit code 2 with the message and no traceback."""


class SaConvError(ValueError):
    """Base of every error whose message is meant for the user of a program."""


class DatasetError(SaConvError):
    """Bad dataset input: names the file or setting and what to do about it."""


class ConfigError(SaConvError):
    """An invalid setting of a program or a configuration file: names the setting and the fix."""
