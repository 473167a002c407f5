"""User-facing errors: one line, what is wrong and what to do. The CLI maps them to their exit code (2 for
bad input)."""


class AdvisorError(ValueError):
    """Bad input from the user. ``str(err)`` is a single line meant to be shown as is. ``exit_code``: what the
    command-line faces exit with (``advisor.faces.run_face``)."""

    exit_code = 2
