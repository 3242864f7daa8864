"""The training controller: rounds of steps on a group of FSDP2-sharded workers (Ray actors, or one rank in this
process), resumable from named checkpoint states. See `controller.py` for the loop, `rounds.py` for what an RL and a
warm-up round do, `grids.py` and `metrics_file.py` for the round's outputs, `plan.py` for the round plan and
validation, `finalize.py` for the export and the in-process training."""

from unirl_core.controller.controller import RAY_RECORD, latest_record, run_round
from unirl_core.controller.finalize import finalize, train_in_process
from unirl_core.controller.metrics_file import METRICS_FILE
from unirl_core.controller.round_plan import (
    Round,
    RoundDeadlineError,
    TrainingConfigError,
    output_dir,
    plan_rounds,
    validate,
)
from unirl_core.controller.rounds import reduce_metrics

__all__ = [
    "METRICS_FILE",
    "RAY_RECORD",
    "Round",
    "RoundDeadlineError",
    "TrainingConfigError",
    "finalize",
    "latest_record",
    "output_dir",
    "plan_rounds",
    "reduce_metrics",
    "run_round",
    "train_in_process",
    "validate",
]
