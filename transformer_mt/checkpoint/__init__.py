"""The checkpoint, in one place: its format (`format`: one dict of plain values and tensors,
written atomically, read with weights_only=True), its record (`record`: what the checkpoint's
model is and what it was trained on, and the one check of whether it fits, for a purpose), the
training state it carries (`training_state`: progress by owner, optimizer, schedule, scaler,
RNG), the folder of a run's checkpoints (`folder`: the only module that names its files) and
averaging."""

from transformer_mt.checkpoint.average import AVERAGED_FROM, average_checkpoints, check_compatible
from transformer_mt.checkpoint.folder import (
    CheckpointFolder,
    is_training_checkpoint,
    load_newest_readable,
    newest_step_checkpoints,
    prune_step_checkpoints,
    step_checkpoints,
)
from transformer_mt.checkpoint.format import FORMAT, load_checkpoint, save_checkpoint
from transformer_mt.checkpoint.record import (
    SHAPE_KEYS,
    Checkpoint,
    CheckpointRecord,
    Mismatch,
    Purpose,
    check_fits,
    decoded_record,
    model_from_checkpoint,
)
from transformer_mt.checkpoint.training_state import (
    DataPosition,
    MovingAverage,
    Progress,
    RngStates,
    TrainingState,
    UpdateCounts,
    ValidationProgress,
)

__all__ = [
    "AVERAGED_FROM",
    "FORMAT",
    "SHAPE_KEYS",
    "Checkpoint",
    "CheckpointFolder",
    "CheckpointRecord",
    "DataPosition",
    "Mismatch",
    "MovingAverage",
    "Progress",
    "Purpose",
    "RngStates",
    "TrainingState",
    "UpdateCounts",
    "ValidationProgress",
    "average_checkpoints",
    "check_compatible",
    "check_fits",
    "decoded_record",
    "is_training_checkpoint",
    "load_checkpoint",
    "load_newest_readable",
    "model_from_checkpoint",
    "newest_step_checkpoints",
    "prune_step_checkpoints",
    "save_checkpoint",
    "step_checkpoints",
]
