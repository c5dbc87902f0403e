"""CUDA out of memory at the step, through the real command (commands/train.train): one line that
names the micro-batch, the key to lower and the last checkpoint; nothing is lost, and the same
command with the smaller trainer.batch_tokens it suggests resumes that checkpoint and trains the
same updates. The GPU's memory is a stand-in: the loss module raises torch.cuda.OutOfMemoryError
for a micro-batch of more padded tokens than it holds (no GPU needed)."""

from __future__ import annotations

import re

import pytest
import torch

from transformer_mt.commands.train import train
from transformer_mt.errors import OutOfMemory
from transformer_mt.run_dir import RunDir
from transformer_mt.train.loss import TrainingLoss

QUICK = ["trainer.valid_every=0", "trainer.valid_bleu_sentences=0", "trainer.checkpoint_every=2"]
MEMORY = 750  # padded tokens (rows x the longer side) the stand-in GPU holds in one micro-batch
LINE = re.compile(
    r"CUDA out of memory in a micro-batch of update (\d+): (\d+) sentences x (\d+) source / "
    r"(\d+) target positions = ([\d,]+) padded tokens \(trainer\.batch_tokens=1500\): run the "
    r"same command with a smaller trainer\.batch_tokens \(e\.g\. trainer\.batch_tokens=(\d+)\); "
    r"it resumes the last checkpoint, update (\d+), each update still of "
    r"trainer\.global_batch_tokens=1200 in more micro-batches \(torch: CUDA out of memory\. "
    r"Tried to allocate 2\.00 GiB\. GPU 0 has a total capacity of 139\.80 GiB of which 1\.12 GiB "
    r"is free\.\)"
)


def test_out_of_memory_is_one_line_and_a_smaller_batch_resumes(tiny_train_job):
    train(tiny_train_job("trainer.max_steps=4", *QUICK))  # checkpoints of updates 2 and 4
    command = ["trainer.max_steps=8", *QUICK]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TrainingLoss, "forward", too_big_raises(TrainingLoss.forward))
        with pytest.raises(OutOfMemory) as raised:
            train(tiny_train_job(*command))
    message = str(raised.value)
    assert "\n" not in message
    found = LINE.fullmatch(message)
    assert found, message
    update, rows, source, target, padded, smaller, saved = found.groups()
    assert (int(update), int(saved)) == (5, 4)  # update 5's first micro-batch; step_4.pt
    assert int(padded.replace(",", "")) == int(rows) * max(int(source), int(target)) > MEMORY
    assert int(smaller) == 750
    run = RunDir(tiny_train_job().run_dir)
    assert run.history()[-1]["event"] == "end" and run.history()[-1]["how"] == "error"
    assert torch.load(run.checkpoints.last, weights_only=True)["step"] == 4  # nothing lost

    # The same command with the smaller budget: under the stand-in's memory, from update 4.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TrainingLoss, "forward", too_big_raises(TrainingLoss.forward))
        last = train(tiny_train_job(*command, f"trainer.batch_tokens={smaller}"))
    assert torch.load(last, weights_only=True)["step"] == 8
    start = [record for record in run.history() if record["event"] == "start"][-1]
    assert (start["kind"], start["step"]) == ("resume", 4)
    assert set(start["changed"]) == {"trainer.batch_tokens"}  # max_steps: as the failed start
    assert start["forced"] == []  # a steering key: the updates themselves are the same


def too_big_raises(forward):
    """TrainingLoss.forward on a stand-in GPU that holds MEMORY padded tokens a micro-batch."""

    def limited(self, src, tgt_in, tgt_out, *args, **kwargs):
        if src.shape[0] * max(src.shape[1], tgt_in.shape[1]) > MEMORY:
            raise torch.cuda.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                "139.80 GiB of which 1.12 GiB is free."
            )
        return forward(self, src, tgt_in, tgt_out, *args, **kwargs)

    return limited
