"""User-facing errors: one line, what is wrong and what to do. The CLI maps them to exit code 2."""


class AdvisorError(ValueError):
    """Bad input from the user. ``str(err)`` is a single line meant to be shown as is."""
