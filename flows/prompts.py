"""Prompt-file checks as a flow: one task per file, run concurrently, a summary artifact in the Prefect UI."""

from __future__ import annotations

from prefect.artifacts import create_table_artifact

from flows.engine import flow
from tasks.prompts import check_prompt_file


@flow(name="check-prompt-files", log_prints=True)
def check_prompt_files(paths: list[str], prompt_key: str = "prompt") -> list[dict]:
    """Validate prompt files (.txt, .jsonl, .json; local or s3://) before they feed a training run."""
    futures = check_prompt_file.map(paths, prompt_key=prompt_key)
    reports = [
        _report(path, future.result(raise_on_failure=False)) for path, future in zip(paths, futures, strict=True)
    ]
    create_table_artifact(
        key="prompt-file-check",
        table=[{k: r[k] for k in ("path", "ok", "num_prompts", "error")} for r in reports],
        description=f"{sum(r['ok'] for r in reports)} of {len(reports)} prompt files usable",
    )
    return reports


def _report(path: str, result: dict | BaseException) -> dict:
    """A task that failed even after its retries (unreadable storage) still gets its row in the summary."""
    if isinstance(result, BaseException):
        return {"path": path, "ok": False, "num_prompts": 0, "error": f"cannot read after retries: {result}"}
    return result
