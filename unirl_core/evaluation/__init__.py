"""Scored evaluation (`unirl eval`): models generate for a prompt set with fixed noise per prompt, named rewards
score the images, and the table gives each mean with a bootstrap interval, or the paired difference of two models
(`run.py`, `models.py`, `stats.py`)."""
