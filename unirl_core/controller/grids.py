"""The grids a round writes: the sample grid of an RL round's last step and the evaluation grid (deterministic
samples of the evaluation prompts), each drawn by the domain (`Domain.grid`: images for diffusion, frame strips for
videos) as a PNG under `<output_dir>/samples/` and an MLflow image. Video samples are also kept as mp4 files with
their prompts, beside the grid (`samples/round_NNN_step_N/`, on disk and in MLflow)."""

from __future__ import annotations

from pathlib import Path

from unirl_core.controller.round_plan import plan_rounds
from unirl_core.data.sources import build_source
from unirl_core.data.video import is_video
from unirl_core.domains.registry import domain_class
from unirl_core.io.storage import write_bytes_atomic
from unirl_core.worker.worker import TrainWorker


class Grids:
    def __init__(self, config, round_, group, mlflow_run, out: Path):
        self.config, self.round, self.group, self.mlflow_run, self.out = config, round_, group, mlflow_run, out
        self.workers = config.ray.workers
        self.domain = domain_class(config.domain.name)

    def evaluate(self, step: int, timeout: float) -> str:
        """Deterministic samples of the evaluation prompts (or the first prompts of the source) as a grid."""
        from unirl_core.controller.round_plan import indexed_shares
        from unirl_core.data.sources import load_eval_prompts

        config, workers = self.config, self.workers
        prompts = [p.prompt for p in load_eval_prompts(config.data)][: config.eval_prompts]
        if not prompts:
            source = build_source(config.data)
            while len(prompts) < config.eval_prompts:
                prompts += [p.prompt for p in source.next_batch()]
            prompts = prompts[: config.eval_prompts]
        results = self.group.scatter(TrainWorker.evaluate, indexed_shares(prompts, workers), config.sampling.seed,
                                     timeout=timeout)  # fmt: skip
        outputs = [output for r in results for output in r][: len(prompts)]
        grid = self.domain.grid(outputs, prompts, cols=1)
        return self.save_grid(grid, self.out / "samples" / f"eval_step_{step:08d}.png", "eval", step)

    def save_samples(self, outputs: list, prompts: list[str]) -> str:
        """The round's last step's samples, a row per prompt."""
        cols = min(self.config.sampling.samples_per_prompt, self.config.grid_images_per_prompt)
        grid = self.domain.grid(outputs, prompts, cols=cols)
        step = self.round.end - 1
        path = self.out / "samples" / f"round_{self.round.index:03d}_step_{step:08d}.png"
        if outputs and all(is_video(output) for output in outputs):
            self.save_videos(outputs, prompts, cols, path.with_suffix(""))
        return self.save_grid(grid, path, "samples", step)

    def save_videos(self, videos: list, prompts: list[str], cols: int, folder: Path) -> None:
        """The grid's videos as `<folder>/prompt_<row>_sample_<col>.mp4` with `prompts.json` (file name -> prompt),
        and the folder to MLflow as `samples/<folder name>/`, beside the grid."""
        import json

        from unirl_core.data.video import encode_mp4

        folder.mkdir(parents=True, exist_ok=True)
        named = {}
        for i, video in enumerate(videos):
            name = f"prompt_{i // cols}_sample_{i % cols}.mp4"
            write_bytes_atomic(str(folder / name), encode_mp4(video))
            named[name] = prompts[i // cols]
        write_bytes_atomic(str(folder / "prompts.json"), json.dumps(named, indent=1).encode())
        self.mlflow_run.log_folder(folder, f"samples/{folder.name}")

    def save_table(self, rows: list[dict]) -> str:
        """The grid's samples as rows (prompt, sample id, the output when it is text, each reward) in
        `samples/round_NNN_step_N.jsonl` and as an MLflow table `samples/round_NNN.json`."""
        import json

        step = self.round.end - 1
        path = self.out / "samples" / f"round_{self.round.index:03d}_step_{step:08d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(str(path), "".join(json.dumps(row) + "\n" for row in rows).encode())
        columns = {key: [row.get(key) for row in rows] for key in dict.fromkeys(k for row in rows for k in row)}
        self.mlflow_run.log_table(columns, f"samples/round_{self.round.index:03d}.json")
        return str(path)

    def save_grid(self, grid, path: Path, key: str, step: int) -> str:
        """The grid, titled with its step, to `path` and to MLflow under `key` (and as `<key>/<file name>`). The
        image card's slider counts a key's grids (0 = the first): the card opens at step 0."""
        import io

        from unirl_core.worker.images import titled

        grid = titled(grid, f"{key}: step {step} ({self.round.name})")
        buffer = io.BytesIO()
        grid.save(buffer, format="PNG")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(str(path), buffer.getvalue())
        self.mlflow_run.log_image(grid, key=key, step=self.grid_number(key), file=path)
        return str(path)

    def grid_number(self, key: str) -> int:
        """This round's grid of `key` among the run's: `samples` one per RL round, `eval` per round evaluated."""
        if key != "eval":
            return self.round.index
        every = self.config.eval_every_rounds
        rl_rounds = [r for r in plan_rounds(self.config) if r.stage == self.round.stage]
        return sum(1 for r in rl_rounds[: self.round.index] if every and (r.index + 1) % every == 0)
