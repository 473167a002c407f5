"""User-facing errors: one line, what is wrong and what to do. The CLI maps them to their exit code (2 for
bad input)."""

import re


class AdvisorError(ValueError):
    """Bad input from the user. ``str(err)`` is a single line meant to be shown as is. ``exit_code``: what the
    command-line faces exit with (``advisor.faces.run_face``)."""

    exit_code = 2


def one_line(err: BaseException, limit: int = 320) -> str:
    """A library's exception message as one line for an ``AdvisorError``: its non-blank lines joined with spaces (a
    first line such as transformers' "Validation error for field 'rope_parameters':" says nothing alone), cut to
    ``limit`` characters with "..."."""
    text = " ".join(line.strip() for line in str(err).splitlines() if line.strip()) or err.__class__.__name__
    # <class 'transformers.x.RopeParameters'> -> RopeParameters
    text = re.sub(r"<class '(?:[\w]+\.)*(\w+)'>", r"\1", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
