"""The one error type a user sees."""


class AutotuneError(Exception):
    """A problem the user can fix.

    The message names what is wrong and says what to do next; the CLI prints it on one
    line and exits with status 1. Any other exception is a bug and shows a traceback.
    """
