"""The training controller: rounds of steps on a group of FSDP2-sharded workers (Ray actors, or one rank in this
process), resumable from named checkpoint states. See `controller.py` for the loop, `plan.py` for the round plan
and validation, `finalize.py` for the export and the in-process training."""

from unirl_core.trainer.controller import METRICS_FILE, RAY_RECORD, latest_record, reduce_metrics, run_round
from unirl_core.trainer.finalize import finalize, train_in_process
from unirl_core.trainer.plan import (
    Round,
    RoundDeadlineError,
    TrainingConfigError,
    output_dir,
    plan_rounds,
    validate,
)

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
