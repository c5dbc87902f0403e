"""tmt-average: the mean of a run's newest checkpoints, as the paper averages its last 5 (base)
or 20 (big), written as a checkpoint that eval and translate load like any other. With last=auto,
how many is chosen by valid BLEU (commands/valid_choice.py), the newest checkpoint alone among
the candidates, and the choice is recorded in the checkpoint written (`average_auto`)."""

from __future__ import annotations

from pathlib import Path

from transformer_mt.checkpoint import (
    AVERAGED_FROM,
    average_checkpoints,
    decoded_record,
    is_training_checkpoint,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
    step_checkpoints,
)
from transformer_mt.commands.valid_choice import average_grid, choose_on_valid, valid_prefix
from transformer_mt.config import AUTO, AverageJob
from transformer_mt.decode.translator import Translator
from transformer_mt.device import prepare_process, resolve_device
from transformer_mt.errors import ConfigError, DamagedCheckpoint
from transformer_mt.files import check_writable
from transformer_mt.run_dir import RunDir


def average(job: AverageJob) -> tuple[list[Path], Path]:
    """Average the newest job.last step checkpoints (last=auto: the best number on valid);
    return them and the file written."""
    job.validate()
    run = RunDir(job.run_dir)
    output = run.checkpoint(job.output)
    check_output(output, job.output, run)
    check_writable(output, "config key 'output'")
    if job.last == AUTO:
        paths, state = best_average_on_valid(job, run)
    else:
        paths = run.checkpoints.newest_steps(job.last)
        state = average_checkpoints(paths, weights=job.weights)
        # what eval and translate will check: refused now, before a file no run can use is written
        decoded_record(state, paths[-1], run.tokenizers())
    save_checkpoint(state, output)
    return paths, output


def check_output(output: Path, name: str, run: RunDir) -> None:
    """ConfigError naming 'output' unless `output` is a new path or an average that tmt-average
    wrote before (a checkpoint of ours with AVERAGED_FROM), and no training checkpoint's name:
    a command replaces only what it wrote, so config.yaml, a copy of a checkpoint or any other
    file of the user's is left as it is."""
    if output.parent.resolve() == run.checkpoints.path.resolve() and is_training_checkpoint(
        output.name
    ):
        raise ConfigError(
            f"config key 'output': {name} is the name of a training checkpoint, which an "
            "average (no optimizer state) must not replace; name another file, e.g. averaged.pt"
        )
    if not (output.exists() or output.is_symlink()):
        return
    try:
        ours = output.is_file() and AVERAGED_FROM in load_checkpoint(output)
    except DamagedCheckpoint:
        ours = False
    if not ours:
        raise ConfigError(
            f"config key 'output': {output} exists and is not an average written by "
            "tmt-average: it is left as it is; name a new file, or remove this one yourself"
        )


def best_average_on_valid(job: AverageJob, run: RunDir) -> tuple[list[Path], dict]:
    """last=auto: of the averages of the newest N step checkpoints, N from average_grid, the
    one whose translation of the valid split's first sentences has the best BLEU, with the
    choice recorded in it."""
    folder = run.checkpoints
    newest = folder.newest_steps(max(1, len(step_checkpoints(folder.path))))  # all that are kept
    sources, references = valid_prefix(run.data_config(), job.valid_sentences, "valid_sentences")
    tokenizers, device = run.tokenizers(), resolve_device(job.device)
    prepare_process(device)  # as tmt-eval's (decode/loading.py)
    unicode_form = run.data_config().unicode_form

    searched = {}  # the settings as the searches ran them (Translator.settings_record)

    def translate(n: int) -> list[str]:
        averaged = average_checkpoints(newest[-n:], weights=job.weights)
        model = model_from_checkpoint(averaged, newest[-1], tokenizers)
        translator = Translator.for_model(
            model, tokenizers, job.decode, device, unicode_form=unicode_form
        )
        searched.update(translator.settings_record())
        return translator.translate(sources)

    choice = choose_on_valid("last", average_grid(len(newest)), translate, references)
    chosen = newest[-choice.chosen :]
    # Again: one candidate in memory at a time.
    recorded = {**choice.to_json(), "decode": searched}
    return chosen, average_checkpoints(chosen, chosen_on_valid=recorded, weights=job.weights)
