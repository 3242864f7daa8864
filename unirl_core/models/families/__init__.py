"""One file per model family, each a `Family` subclass registered by name (see `unirl_core.models.registry`)."""
