"""One evaluation: models x a prompt set, generated with fixed noise per prompt and scored by named rewards, in
shards that are committed one by one (a re-run scores only the missing ones), then summarized.

    <output_dir>/spec.json                      what is evaluated (models, prompts and their digest, rewards,
                                                steps, guidance, size, seed, shards): a folder holds one evaluation
    <output_dir>/<label>/images/<index>.png     each prompt's image (index: the prompt's place in the file); a
                                                video as <index>.mp4, a text domain's completion as <index>.txt
                                                (and an `output` column)
    <output_dir>/<label>/shards/<shard>.parquet each shard's scores: index, prompt_id, prompt, one column per
                                                reward (written last: the shard's commit record)
    <output_dir>/results.parquet                every model's scores, one row per (model, prompt)
    <output_dir>/summary.json                   per reward and model: mean, bootstrap 95 % interval, n; with a
                                                baseline, the paired differences (`stats.py`)

Labels: `model` (the model evaluated) and `against` (the baseline of `--against`). A prompt's noise depends on the
seed and its index only, so both models start every prompt from the same noise, in any shard or batch size.
"""

from __future__ import annotations

import hashlib
import io
import json
import threading
import time
from pathlib import Path

from pydantic import BaseModel, Field

from unirl_core.config.schema import RewardConfig
from unirl_core.errors import UserError
from unirl_core.evaluation import stats
from unirl_core.evaluation.models import EvalModel
from unirl_core.io.storage import write_bytes_atomic

SPEC_FILE = "spec.json"
SUMMARY_FILE = "summary.json"
RESULTS_FILE = "results.parquet"
LABELS = ("model", "against")


class EvalError(UserError, ValueError):
    """An evaluation that cannot run as asked; the message names the input and the fix."""


class NotComparableError(EvalError):
    """Two models a paired evaluation cannot compare (another family or domain: other noise, another decoder)."""


class EvalSpec(BaseModel):
    """Everything an evaluation's numbers depend on, and where it writes."""

    models: list[EvalModel] = Field(min_length=1, max_length=2)  # the model, then the baseline (`--against`)
    prompts: str
    prompts_sha256: str
    rewards: list[str] = Field(min_length=1)
    reward: RewardConfig  # the model rewards' settings (weights: the evaluated rewards)
    steps: int
    guidance: float
    height: int
    width: int
    seed: int
    shard_size: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    output_dir: str
    device: str = "auto"

    def identity(self) -> dict:
        """The spec without where it writes: two specs with one identity give the same numbers (each model's whole
        config and the kind of device are part of it)."""
        from unirl_core.precache.run import resolve_device

        data = self.model_dump(mode="json", exclude={"output_dir", "device", "models"})
        return data | {"models": [m.identity() for m in self.models], "device": resolve_device(self.device).type}

    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.identity(), sort_keys=True).encode()).hexdigest()[:12]

    def labels(self) -> list[str]:
        return list(LABELS[: len(self.models)])

    def count(self) -> int:
        from unirl_core.data.prompts import load_prompts

        return len(load_prompts(self.prompts))

    def shards(self, count: int) -> list[tuple[int, int]]:
        """(first index, end) of every shard of `count` prompts."""
        return [(first, min(first + self.shard_size, count)) for first in range(0, count, self.shard_size)]

    def shard_file(self, label: str, shard: int) -> Path:
        return Path(self.output_dir) / label / "shards" / f"{shard:05d}.parquet"

    def image_file(self, label: str, index: int) -> Path:
        return Path(self.output_dir) / label / "images" / f"{index:06d}.png"


def file_digest(path: str) -> str:
    from unirl_core.io import storage

    return hashlib.sha256(storage.read_bytes(path)).hexdigest()


def check_folder(spec: EvalSpec) -> bool:
    """Whether the output folder holds this evaluation already (False: a new one, the folder made); an EvalError
    when it holds another, or cannot be a folder."""
    folder = Path(spec.output_dir)
    if folder.exists() and not folder.is_dir():
        raise EvalError(f"{folder}: not a folder; pass --out a folder for the evaluation")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EvalError(f"{folder}: cannot be made ({exc.strerror or exc}); pass --out a writable folder") from None
    written = folder / SPEC_FILE
    if not written.is_file():
        return False
    try:
        before = json.loads(written.read_text()).get("identity", {})
    except (ValueError, AttributeError):
        before = {}
    if before != spec.identity():
        changed = sorted(k for k in spec.identity() if before.get(k) != spec.identity()[k])
        raise EvalError(f"{folder}: holds another evaluation (it differs in {', '.join(changed)}); pass another "
                        "--out, or delete the folder to evaluate again")  # fmt: skip
    return True


def prepare(spec: EvalSpec) -> list[tuple[str, int]]:
    """Write the spec (or check that the folder holds this evaluation); returns the (label, shard) not yet scored."""
    written = Path(spec.output_dir) / SPEC_FILE
    if not check_folder(spec):
        record = {"key": spec.key(), "identity": spec.identity(), "spec": spec.model_dump(mode="json")}
        write_bytes_atomic(str(written), json.dumps(record, indent=1).encode())
    count = spec.count()
    return [
        (label, shard)
        for label in spec.labels()
        for shard in range(len(spec.shards(count)))
        if not spec.shard_file(label, shard).is_file()
    ]


# what a process keeps between the shards of a flow (its tasks share the process): the policy of the last model
# scored (one on the device at a time) and the reward services; filled under _device_lock
_policy: dict[str, tuple] = {}
_scorers: dict[str, object] = {}
_device_lock = threading.Lock()  # one shard generates at a time (the tasks' threads share one device)


def _model(spec: EvalSpec, label: str, device):
    from unirl_core.evaluation.models import load_policy

    model = spec.models[spec.labels().index(label)]
    key = json.dumps([model.identity(), str(device)], sort_keys=True)
    if key not in _policy:
        _policy.clear()
        if device.type == "cuda":
            import torch

            torch.cuda.empty_cache()
        _policy[key] = load_policy(model, str(device))
    return _policy[key]


def _rewards(spec: EvalSpec, device):
    from unirl_core.rewards.service import RewardService

    key = json.dumps([spec.reward.model_dump(mode="json"), str(device)], sort_keys=True)
    if key not in _scorers:
        _scorers[key] = RewardService.from_config(spec.reward, device=str(device))
    return _scorers[key]


def score_shard(spec: EvalSpec, label: str, shard: int) -> dict:
    """Generate and score shard `shard` of model `label` (skipped when committed): its images, then its scores.
    Returns {"prompts": n, "seconds_generate": s, "seconds_score": s} (0 prompts when it was committed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from unirl_core.data.prompts import load_prompts
    from unirl_core.precache.run import resolve_device

    target = spec.shard_file(label, shard)
    if target.is_file():
        return {"prompts": 0, "seconds_generate": 0.0, "seconds_score": 0.0}
    examples = load_prompts(spec.prompts)
    first, end = spec.shards(len(examples))[shard]
    chosen = examples[first:end]
    device = resolve_device(spec.device)
    with _device_lock, torch.no_grad():
        domain, policy = _model(spec, label, device)
        started = time.perf_counter()
        images = []
        for start in range(0, len(chosen), spec.batch_size):
            batch = [e.prompt for e in chosen[start : start + spec.batch_size]]
            images += domain.evaluate(policy, None, batch, first + start, spec.seed)
        generated = time.perf_counter()
        scores = _rewards(spec, device).score(
            images, [e.prompt for e in chosen], [f"eval:{first + i}" for i in range(len(chosen))],
            [e.metadata for e in chosen],
        )  # fmt: skip
        scored = time.perf_counter()
    texts = all(isinstance(output, str) for output in images)  # a text domain's completions
    for offset, output in enumerate(images):
        path = spec.image_file(label, first + offset)
        if texts:
            write_bytes_atomic(str(path.with_suffix(".txt")), output.encode())
            continue
        write_bytes_atomic(*_encoded(output, path))
    columns = {
        "index": pa.array(range(first, end), pa.int64()),
        "prompt_id": pa.array([e.prompt_id for e in chosen], pa.string()),
        "prompt": pa.array([e.prompt for e in chosen], pa.string()),
    } | ({"output": pa.array(images, pa.string())} if texts else {})
    columns |= {name: pa.array(scores[name], pa.float64()) for name in spec.rewards}
    buffer = io.BytesIO()
    pq.write_table(pa.table(columns), buffer)
    write_bytes_atomic(str(target), buffer.getvalue())
    return {"prompts": len(chosen), "seconds_generate": generated - started, "seconds_score": scored - generated}


def _encoded(output, path: Path) -> tuple[str, bytes]:
    """(where, bytes) of one generated output: a video as mp4 beside the images' place, an image as PNG."""
    from unirl_core.data.video import Video, encode_mp4

    if isinstance(output, Video):
        return str(path.with_suffix(".mp4")), encode_mp4(output)
    buffer = io.BytesIO()
    output.save(buffer, format="PNG")
    return str(path), buffer.getvalue()


class EvalReport(BaseModel):
    """The evaluation's table: `metrics` per (reward, label) and `differences` per reward (model - against)."""

    output_dir: str
    key: str
    prompts: int
    metrics: list[dict]
    differences: list[dict]


def read_scores(spec: EvalSpec, label: str, count: int) -> dict[str, list]:
    """Model `label`'s committed scores by column (index order); an error names a missing shard."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for shard in range(len(spec.shards(count))):
        path = spec.shard_file(label, shard)
        if not path.is_file():
            raise EvalError(f"{path}: shard {shard} of {label} is not scored; run the evaluation again")
        tables.append(pq.read_table(path))
    return pa.concat_tables(tables).to_pydict()


def finish(spec: EvalSpec) -> EvalReport:
    """Gather every committed shard into results.parquet and the summary (both rewritten whole)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    count = spec.count()
    scores = {label: read_scores(spec, label, count) for label in spec.labels()}
    rows = [{"model": label} | dict(zip(columns, values, strict=True))
            for label, columns in scores.items() for values in zip(*columns.values(), strict=True)]  # fmt: skip
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    write_bytes_atomic(str(Path(spec.output_dir) / RESULTS_FILE), buffer.getvalue())
    metrics, differences = [], []
    for reward in spec.rewards:
        for label, columns in scores.items():
            metrics.append({"reward": reward, "model": label} | stats.estimate(columns[reward]).as_dict())
        if len(scores) == 2:
            difference = stats.paired_difference(scores["model"][reward], scores["against"][reward])
            differences.append({"reward": reward} | difference.as_dict())
    report = EvalReport(output_dir=spec.output_dir, key=spec.key(), prompts=count, metrics=metrics,
                        differences=differences)  # fmt: skip
    summary = report.model_dump(mode="json", exclude={"output_dir"}) | {"models": [m.identity() for m in spec.models]}
    write_bytes_atomic(str(Path(spec.output_dir) / SUMMARY_FILE), json.dumps(summary, indent=1).encode())
    return report


def _check_device(device: str) -> None:
    import torch

    if device not in ("auto", "cpu", "cuda") and not device.startswith("cuda:"):
        raise EvalError(f"--device {device!r}: choose auto, cpu, cuda or cuda:N")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise EvalError(f"--device {device}: this machine has no CUDA device torch can use; pass --device cpu")


def build_spec(
    model: str,
    against: str | None = None,
    recipe_train=None,
    prompts: str | None = None,
    rewards: list[str] | None = None,
    steps: int | None = None,
    guidance: float | None = None,
    seed: int | None = None,
    shard_size: int = 16,
    batch_size: int = 4,
    output_dir: str | None = None,
    device: str = "auto",
) -> EvalSpec:
    """The spec of evaluating `model` (and `against`, on the same prompts and noise): steps, guidance, size, seed,
    sampler and rewards default to the model's recipe (its evaluation settings, its weighted rewards and guards),
    the prompts to its `data.eval_data_path`; `output_dir` to $UNIRL_HOME/eval/<key>."""
    from unirl_core.data.prompts import load_prompts
    from unirl_core.evaluation import prompt_sets
    from unirl_core.evaluation.models import resolve, with_sampling
    from unirl_core.io import storage

    _check_device(device)
    models = [resolve(model, recipe_train)] + ([resolve(against, recipe_train)] if against else [])
    first = models[0].config
    if len(models) == 2:
        other = models[1].config
        if (first.domain.name, first.model.family) != (other.domain.name, other.model.family):
            raise NotComparableError(f"--against {against}: a {other.model.family} model, but {model} is {first.model.family}; "
                            "a paired comparison needs one family (the same latent noise and decoder)")  # fmt: skip
    prompts = prompts or first.data.eval_data_path
    prompts = prompt_sets.resolve(prompts) if prompts else prompts  # a packaged set by name
    if prompts and not storage.is_url(prompts):
        prompts = str(Path(prompts).expanduser().resolve())  # one file, one identity, by any path
    if not prompts:
        raise EvalError("no prompts: pass --prompts FILE (a .txt, .jsonl or .json prompt file) or a set (geneval, ocr, "
                        "aesthetic), or set the recipe's train.data.eval_data_path")  # fmt: skip
    load_prompts(prompts)  # a PromptDataError names the file and the record
    steps = steps or first.sampling.eval_steps
    guidance = first.sampling.eval_guidance if guidance is None else guidance
    sampling = first.sampling
    models = [with_sampling(m, steps, guidance, sampling.height, sampling.width, first.algorithm) for m in models]
    rewards = list(dict.fromkeys(rewards or [*first.reward.weights, *first.reward.guards]))
    settings = (recipe_train or first).reward  # the model rewards' folders: --recipe's, else the model's recipe
    reward = RewardConfig.model_validate(
        settings.model_dump() | {"weights": dict.fromkeys(rewards, 1.0), "guards": [], "placement": "colocated"}
    )
    problems = [f"{path}: {message}" for path, _, message in reward.problems()]
    if problems:
        raise EvalError(
            "rewards: "
            + "; ".join(problems)
            .replace("weights.", "--reward ")
            .replace("train.reward.", "the recipe's train.reward.")
        )
    spec = EvalSpec(models=models, prompts=prompts, prompts_sha256=file_digest(prompts), rewards=rewards,
                    reward=reward, steps=steps, guidance=guidance, height=sampling.height, width=sampling.width,
                    seed=sampling.seed if seed is None else seed, shard_size=shard_size, batch_size=batch_size,
                    output_dir="", device=device)  # fmt: skip
    if output_dir is None:
        from unirl_core.workspace import workspace

        output_dir = str(workspace().root / "eval" / spec.key())
    return spec.model_copy(update={"output_dir": str(output_dir)})
