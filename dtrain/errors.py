"""The one exception type for mistakes a user can fix."""
from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input: printed as one line, exit code 2, no traceback.

    The message says what is wrong, where, and how to fix it.
    """
