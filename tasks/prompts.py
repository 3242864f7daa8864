"""Prompt-file tasks: thin Prefect adapters around unirl_core.data.prompts."""

from __future__ import annotations

from prefect import task

from unirl_core.data.prompts import PromptDataError, load_prompts


@task(name="check-prompt-file", task_run_name="check {path}", retries=2, retry_delay_seconds=1)
def check_prompt_file(path: str, prompt_key: str = "prompt") -> dict:
    """Load and normalize one prompt file. A malformed file is a report, not a failure (the other files still
    run, and retrying cannot fix it); anything else raised, such as a flaky S3 read, is retried."""
    try:
        examples = load_prompts(path, prompt_key=prompt_key)
    except PromptDataError as exc:
        return {"path": path, "ok": False, "num_prompts": 0, "error": str(exc)}
    with_media = sum(1 for e in examples if e.media_refs)
    return {"path": path, "ok": True, "num_prompts": len(examples), "with_media": with_media, "error": None}
