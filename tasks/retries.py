"""Retry conditions for tasks: transient errors are retried, permanent ones fail at once."""

from __future__ import annotations

from unirl_core.io.storage import is_permanent


def retry_unless(*permanent: type[BaseException], transient: tuple[type[BaseException], ...] = ()):
    """A Prefect `retry_condition_fn`: retry I/O trouble (OSError, ConnectionError, TimeoutError: network, 5xx,
    S3 throttling) and the `transient` errors; never the `permanent` errors (bad input, bad config), an OSError a
    retry cannot fix (disk full, read-only, no permission: `storage.PERMANENT_ERRNOS`) nor anything unexpected."""

    def is_transient(task, task_run, state) -> bool:
        try:
            state.result()
        except permanent:
            return False
        except (OSError, ConnectionError, TimeoutError, *transient) as exc:
            return not is_permanent(exc)
        except Exception:
            return False
        return False

    return is_transient
