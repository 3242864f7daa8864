"""What a training run shows on its MLflow pages, as plain values (no mlflow import): the few params worth a
column, the run's description, the source tags (git commit, command, user, unirl version), a link check.

MLflow's image card lists every param of the run under each image ("Show run parameters" is on by default), so
the run gets the recipe's defining knobs as params and the whole resolved recipe as the artifact `recipe.yaml`.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

# The recipe keys a run is compared by (dotted paths of the resolved train section); the rest is in recipe.yaml.
KEY_PARAMS = (
    "domain",
    "model.path",
    "model.lora.rank",
    "model.lora.target_modules",
    "algorithm.name",
    "algorithm.learning_rate",
    "algorithm.eta",
    "algorithm.clip_range",
    "reward.weights",
    "data.prompts_per_rollout",
    "sampling.samples_per_prompt",
    "steps",
    "warmup.steps",
)


def key_params(flat: Mapping[str, str]) -> dict[str, str]:
    """The KEY_PARAMS entries of a flattened recipe (a mapping key keeps its sub-keys: reward.weights.clip)."""
    return {k: v for k, v in flat.items() if any(k == p or k.startswith(f"{p}.") for p in KEY_PARAMS)}


def http_url(raw: Any) -> str | None:
    """`raw` when it is a real http(s) URL with a host, else None (Prefect's `flow_run.ui_url` reads
    `None/flow-runs/flow-run/<id>` when no UI URL is known)."""
    if not isinstance(raw, str):
        return None
    parsed = urlparse(raw)
    return raw if parsed.scheme in ("http", "https") and parsed.netloc else None


def run_description(recipe: Mapping[str, Any], run_name: str, tags: Mapping[str, str]) -> str:
    """The run's description (markdown, a few lines): what trains on what, and where its Prefect flow run is."""
    model, algorithm, reward = recipe.get("model", {}), recipe.get("algorithm", {}), recipe.get("reward", {})
    weights = ", ".join(f"{k} x{v}" for k, v in (reward.get("weights") or {}).items()) or "none"
    warmup = (recipe.get("warmup") or {}).get("steps") or 0
    lines = [
        f"**{run_name}**: `{model.get('path')}` ({model.get('family')}, "
        f"{'LoRA rank ' + str(model['lora']['rank']) if model.get('lora') else 'full fine-tuning'}) trained with "
        f"{algorithm.get('name')} on reward {weights}; {warmup} warm-up + {recipe.get('steps')} RL steps.",
        "",
        "Images: `samples` (one grid per RL round: its last step's rollouts), `eval` (fixed prompts and noise); the "
        "slider counts grids, each grid names its step. The whole resolved recipe: artifact `recipe.yaml`.",
    ]
    if line := prefect_line(tags):
        lines += ["", line]
    return "\n".join(lines)


def prefect_line(tags: Mapping[str, str]) -> str:
    """Where the run's Prefect flow run is: a link to its page when Prefect knew its UI, else its name and id and
    the Prefect API it ran against (PREFECT_API_URL; unset: Prefect's temporary server, which `unirl serve`
    replaces with one that keeps a UI and the history); "" without a flow run."""
    name, run_id = tags.get("prefect.flow_run_name", ""), tags.get("prefect.flow_run_id", "")
    if url := http_url(tags.get("prefect.flow_run_url")):
        return f"Prefect flow run: [{name or url}]({url})"
    if not run_id:
        return ""
    api = http_url(tags.get("prefect.api_url")) or http_url(os.environ.get("PREFECT_API_URL"))
    where = f"on the Prefect API `{api}`" if api else "on Prefect's temporary server (`unirl serve` keeps a UI)"
    return f"Prefect flow run: {name} (id `{run_id}`) {where}"


def source_tags() -> dict[str, str]:
    """MLflow's source tags for this process: the command, the user, the unirl version and, when the code runs
    from a git checkout, its commit and branch (read from .git, no subprocess)."""
    from importlib.metadata import PackageNotFoundError, version

    tags = {"mlflow.source.name": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:500] or "python",
            "mlflow.source.type": "LOCAL"}  # fmt: skip
    with contextlib.suppress(PackageNotFoundError):
        tags["unirl.version"] = version("unirl")
    with contextlib.suppress(KeyError, OSError):  # no user name for this uid (a container)
        tags["mlflow.user"] = getpass.getuser()
    try:
        commit, branch = git_head(Path(__file__).resolve().parent)
    except (OSError, ValueError, IndexError):  # an unreadable or odd .git: no commit recorded
        commit = branch = None
    if commit:
        tags["mlflow.source.git.commit"] = commit
    if branch:
        tags["mlflow.source.git.branch"] = branch
    return tags


def git_head(start: Path) -> tuple[str | None, str | None]:
    """(commit, branch) of the git checkout holding `start`, read from its .git (a folder, or a worktree's
    `gitdir:` file); (None, None) outside a checkout."""
    for folder in (start, *start.parents):
        dot_git = folder / ".git"
        if dot_git.is_file():  # a worktree or submodule: "gitdir: <path>"
            dot_git = (folder / dot_git.read_text().split(":", 1)[1].strip()).resolve()
        if dot_git.is_dir():
            return _resolve_head(dot_git)
    return None, None


def _resolve_head(git_dir: Path) -> tuple[str | None, str | None]:
    head = (git_dir / "HEAD").read_text().strip()
    if not head.startswith("ref:"):
        return head or None, None  # a detached HEAD holds the commit itself
    ref = head.split(":", 1)[1].strip()
    common = git_dir / "commondir"  # a worktree keeps its refs in the main .git
    common_dir = (git_dir / common.read_text().strip()).resolve() if common.is_file() else git_dir
    for root in dict.fromkeys((git_dir, common_dir)):
        if (root / ref).is_file():
            return (root / ref).read_text().strip(), ref.removeprefix("refs/heads/")
        packed = root / "packed-refs"
        for line in packed.read_text().splitlines() if packed.is_file() else []:
            if line.endswith(f" {ref}"):
                return line.split(" ", 1)[0], ref.removeprefix("refs/heads/")
    return None, ref.removeprefix("refs/heads/")  # a branch with no commit yet


def recipe_yaml(recipe: Mapping[str, Any]) -> str:
    """The resolved recipe as YAML, in the recipe's own key order (the run's `recipe.yaml`)."""
    import yaml

    return yaml.safe_dump(dict(recipe), sort_keys=False, width=120)
