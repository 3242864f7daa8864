"""`unirl eval`'s images/s vs the bare diffusers pipeline generating the same images (issue 38's goal: >= 0.9x).

Both sides generate N prompts in batches of B at the same steps, guidance and size on the same loaded pipeline:
`unirl eval`'s shard work (`run.score_shard`: fixed noise per prompt, the family's transitions, decoding, each image
written as PNG and scored with one weight-free reward) and the pipeline's own `__call__` (output_type="pil", one
generator per batch). The fastest of `--repeat` passes of each, interleaved (other work on a shared machine only
adds time). Prints both and the ratio.

    python benchmarks/eval_throughput.py                                  # tiny SD3 (the demo recipe), CPU
    python benchmarks/eval_throughput.py --smoke      # seconds: 2 prompts, 2 steps, one pass each, one thread
    python benchmarks/eval_throughput.py --recipe sd35_medium_grpo --model-path /models/sd35m --device cuda
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="demo")
    parser.add_argument("--model-path", default=None, help="default: the recipe's train.model.path")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=None, help="default: the recipe's eval steps")
    parser.add_argument("--guidance", type=float, default=None, help="default: the recipe's eval guidance")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (default: all cores)")
    parser.add_argument("--smoke", action="store_true", help="seconds: 2 prompts, 2 steps, one pass, one thread "
                        "(make test's)")  # fmt: skip
    args = parser.parse_args()
    if args.smoke:
        args.prompts, args.batch_size, args.repeat, args.steps, args.threads = 2, 2, 1, args.steps or 2, 1
    os.environ.setdefault("UNIRL_HOME", tempfile.mkdtemp(prefix="unirl-eval-bench-"))

    from unirl_core.config import load_recipe
    from unirl_core.evaluation import run

    recipe = load_recipe(args.recipe, [])
    path = args.model_path or recipe.train.model.path
    folder = Path(tempfile.mkdtemp(prefix="eval-bench-"))
    prompts = folder / "prompts.txt"
    prompts.write_text("".join(f"a photo of object {i}\n" for i in range(args.prompts)))
    spec = run.build_spec(path, recipe_train=recipe.train, prompts=str(prompts), rewards=["brightness"],
                          steps=args.steps, guidance=args.guidance, shard_size=args.prompts, batch_size=args.batch_size,
                          output_dir=str(folder / "out"), device=args.device)  # fmt: skip
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    _, policy = run._model(spec, "model", device)  # loaded once, shared by both sides
    print(f"{spec.models[0].config.model.family} at {path}: {args.prompts} prompts, batch {args.batch_size}, "
          f"{spec.steps} steps, guidance {spec.guidance:g}, {spec.width}x{spec.height}, {device}")  # fmt: skip

    def unirl_eval() -> float:
        shutil.rmtree(folder / "out", ignore_errors=True)
        run.prepare(spec)
        started = time.perf_counter()
        run.score_shard(spec, "model", 0)
        return time.perf_counter() - started

    def bare() -> float:
        started = time.perf_counter()
        with torch.no_grad():
            for first in range(0, args.prompts, args.batch_size):
                batch = [f"a photo of object {i}" for i in range(first, min(first + args.batch_size, args.prompts))]
                policy.pipeline(
                    prompt=batch, num_inference_steps=spec.steps, guidance_scale=spec.guidance, height=spec.height,
                    width=spec.width, generator=torch.Generator(device=device).manual_seed(first), output_type="pil",
                )  # fmt: skip
        return time.perf_counter() - started

    unirl_eval(), bare()  # warm-up: first-call allocations, lazy imports
    seconds = {"unirl eval": [], "bare pipeline": []}
    for _ in range(args.repeat):
        seconds["unirl eval"].append(unirl_eval())
        seconds["bare pipeline"].append(bare())
    best = {name: min(values) for name, values in seconds.items()}
    print(f"{'':<16} {'seconds':>8} {'images/s':>9}")
    for name, value in best.items():
        print(f"{name:<16} {value:>8.2f} {args.prompts / value:>9.2f}")
    print(f"\nunirl eval images/s vs the bare pipeline's: {best['bare pipeline'] / best['unirl eval']:.2f}x "
          "(goal >= 0.90x)")  # fmt: skip
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
