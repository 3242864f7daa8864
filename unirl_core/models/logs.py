"""Quiet model libraries: no progress bars or advisory warnings from diffusers/transformers in our output."""

from __future__ import annotations


def quiet_model_libraries() -> None:
    import diffusers
    import transformers

    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
