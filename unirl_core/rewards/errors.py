"""The two ways scoring fails: a score that must not be trained on (permanent), or a scorer out of reach (transient)."""

from __future__ import annotations

from unirl_core.errors import UserError


class RewardError(UserError, ValueError):
    """A reward that must not be trained on (non-finite, missing or malformed), naming the samples or the scorer.

    Permanent: retrying the step gives the same answer, so the task layer does not retry it."""


class ScorerUnavailableError(ConnectionError):
    """A remote scorer that did not answer (connection refused, timeout, 5xx/429 after every retry).

    Transient (a ConnectionError, hence an OSError): the task layer may retry the step."""
