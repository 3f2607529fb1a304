"""The one exception type whose message is shown to the user as a single line."""


class UserError(Exception):
    """Bad input: the message names the problem and the fix; the CLI prints it and exits 2."""
