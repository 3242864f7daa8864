"""Exact resume of data readers: a reader's state is its settings plus where it stands, and a saved state is refused
when any setting changed (other files, seed, batch size, world size ...), naming each change."""

from __future__ import annotations

from typing import Any


def describe_changes(saved: dict[str, Any], now: dict[str, Any]) -> str | None:
    """'key: old then, new now, ...' for every setting of `now` that differs in `saved`; None when none does."""
    changed = {k: (saved.get(k), v) for k, v in now.items() if saved.get(k) != v}
    if not changed:
        return None
    return ", ".join(f"{k}: {then!r} then, {value!r} now" for k, (then, value) in changed.items())


class EpochCursor:
    """A reader that visits its items epoch by epoch in the order `_epoch_order(epoch)` gives, `batch_in_epoch`
    batches at a time. Subclasses provide `_settings()`, `_epoch_order(epoch)` and `_resume_error(details)`."""

    epoch: int
    batch_in_epoch: int

    def state_dict(self) -> dict[str, Any]:
        return {**self._settings(), "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue with exactly the batch after `state`; refuse a state taken with other items or settings."""
        details = describe_changes(state, self._settings())
        if details:
            raise ValueError(self._resume_error(details))
        self.epoch, self.batch_in_epoch = int(state["epoch"]), int(state["batch_in_epoch"])
        self._order = self._epoch_order(self.epoch)

    def _settings(self) -> dict[str, Any]:
        raise NotImplementedError

    def _epoch_order(self, epoch: int):
        raise NotImplementedError

    def _resume_error(self, details: str) -> str:
        raise NotImplementedError
