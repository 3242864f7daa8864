"""The one base class of errors a user can cause and fix."""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix, not a bug: a bad recipe or override, unusable input data, a checkpoint from
    another run, a config that cannot train. The message names the offending value and says how to fix it.

    The `unirl` command prints it as one `error: <message>` line on stderr (no traceback) and exits 2; tasks never
    retry it (retrying cannot fix it). Subclasses keep their built-in base as well (`class RecipeError(UserError,
    ValueError)`), so `except ValueError` still catches them.
    """
