"""Checkpoint averaging: the mean of each parameter, refused for checkpoints of different models."""

from dataclasses import asdict
from types import SimpleNamespace

import pytest
import torch

from transformer_mt.checkpoint import (
    average_checkpoints,
    load_checkpoint,
    model_from_checkpoint,
    newest_step_checkpoints,
    save_checkpoint,
)
from transformer_mt.config import ModelConfig
from transformer_mt.errors import CheckpointError
from transformer_mt.model import Transformer

VOCAB = 40
TINY = ModelConfig(
    name="tiny", d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1
)


def write_checkpoint(path, *, seed=0, step=10, cfg=TINY, vocab_size=VOCAB):
    """A checkpoint as the trainer writes it, with a freshly initialised real Transformer."""
    torch.manual_seed(seed)
    model = Transformer(cfg, vocab_size=vocab_size, pad_id=0)
    optimizer = torch.optim.Adam(model.parameters())
    save_checkpoint(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "model_config": asdict(cfg),
            "vocab_size": vocab_size,
            "src_vocab_size": None,
            "data_folder": "toy-0123",
            "step": step,
            "rng_cpu": torch.get_rng_state(),
        },
        path,
    )
    return path


def test_average_of_copies_is_the_checkpoint_itself(tmp_path):
    path = write_checkpoint(tmp_path / "step_10.pt")
    averaged = average_checkpoints([path, path, path])
    original = load_checkpoint(path)["model"]
    assert averaged["model"].keys() == original.keys()
    for name, tensor in original.items():
        assert averaged["model"][name].dtype == tensor.dtype
        assert torch.equal(averaged["model"][name], tensor), name
    assert averaged["averaged_from"] == ["step_10.pt"] * 3
    assert not {"optimizer", "scheduler", "rng_cpu", "progress"} & averaged.keys()


def test_average_of_two_is_the_mean_and_loads_for_decoding(tmp_path):
    a = write_checkpoint(tmp_path / "step_10.pt", seed=1, step=10)
    b = write_checkpoint(tmp_path / "step_20.pt", seed=2, step=20)
    averaged = average_checkpoints([a, b])
    save_checkpoint(averaged, tmp_path / "averaged.pt")
    loaded = load_checkpoint(tmp_path / "averaged.pt")
    first, second = load_checkpoint(a)["model"], load_checkpoint(b)["model"]
    for name, mean in loaded["model"].items():
        torch.testing.assert_close(mean, (first[name] + second[name]) / 2, rtol=1e-7, atol=1e-8)
    assert loaded["step"] == 20 and loaded["data_folder"] == "toy-0123"
    assert loaded["averaged_from"] == ["step_10.pt", "step_20.pt"]
    tokenizers = SimpleNamespace(
        shared=True,
        tgt=SimpleNamespace(vocab_size=VOCAB),
        sha256=None,
        files=[tmp_path / "spm.model"],
    )
    model = model_from_checkpoint(loaded, tmp_path / "averaged.pt", tokenizers)
    assert torch.equal(model.embed.weight, loaded["model"]["embed.weight"])


@pytest.mark.parametrize(
    ("other", "key"),
    [
        ({"cfg": ModelConfig(**{**asdict(TINY), "d_model": 32})}, "model_config.d_model"),
        ({"vocab_size": VOCAB + 8}, "vocab_size"),
    ],
)
def test_incompatible_checkpoints_are_refused_naming_files_and_key(tmp_path, other, key):
    a = write_checkpoint(tmp_path / "step_10.pt")
    b = write_checkpoint(tmp_path / "step_20.pt", **other)
    with pytest.raises(CheckpointError, match=rf"step_10\.pt and .*step_20\.pt .*: {key} differs"):
        average_checkpoints([a, b])


def test_non_float_tensors_must_agree_and_are_copied(tmp_path):
    def write(name, count):
        state = {"model": {"w": torch.ones(2), "count": torch.tensor([count])}}
        save_checkpoint({**state, "model_config": {}, "vocab_size": 5, "step": 1}, tmp_path / name)
        return tmp_path / name

    averaged = average_checkpoints([write("a.pt", 3), write("b.pt", 3)])
    assert torch.equal(averaged["model"]["count"], torch.tensor([3]))
    with pytest.raises(CheckpointError, match="model.count differs"):
        average_checkpoints([write("a.pt", 3), write("c.pt", 4)])


def test_no_checkpoints_is_refused():
    with pytest.raises(CheckpointError, match="no checkpoints"):
        average_checkpoints([])


def test_newest_step_checkpoints_orders_by_step_number(tmp_path):
    for name in ("step_2.pt", "step_9.pt", "step_10.pt", "last.pt", ".step_11.pt.tmp"):
        (tmp_path / name).write_bytes(b"x")
    newest = newest_step_checkpoints(tmp_path, 2)
    assert [p.name for p in newest] == ["step_9.pt", "step_10.pt"]  # by name: step_2, step_9
    with pytest.raises(CheckpointError, match="4 step checkpoints requested, but there are only 3"):
        newest_step_checkpoints(tmp_path, 4)


def test_auto_candidates_include_the_newest_alone_and_all_that_are_kept():
    from transformer_mt.commands.valid_choice import average_grid

    assert average_grid(1) == [1]
    assert average_grid(4) == [1, 2, 3, 4]
    assert average_grid(5) == [1, 2, 3, 5]
    assert average_grid(30) == [1, 2, 3, 5, 8, 13, 20, 30]


def test_choice_on_valid_keeps_the_best_score_and_the_first_of_equals(monkeypatch):
    from transformer_mt.commands import valid_choice

    bleu = {"1": 20.0, "2": 31.5, "3": 31.5, "5": 12.0}  # 2 and 3 tie: the first (fewer) wins
    monkeypatch.setattr(
        valid_choice, "valid_bleu", lambda hypotheses, references: bleu[hypotheses[0]]
    )
    choice = valid_choice.choose_on_valid("last", [1, 2, 3, 5], lambda n: [str(n)], ["a ref"])
    assert choice.chosen == 2
    assert choice.to_json() == {
        "grid": [1, 2, 3, 5],
        "valid_bleu": bleu,
        "chosen": 2,
        "valid_sentences": 1,
    }


@pytest.mark.parametrize("last", ["0", "-3", "five", "2.5", "true", "null"])
def test_a_bad_last_is_a_one_line_config_error_naming_the_key(last):
    from transformer_mt.commands.average import average
    from transformer_mt.config import compose_job
    from transformer_mt.errors import ConfigError

    with pytest.raises(ConfigError, match="config key 'last'") as refused:
        average(compose_job("average", ["run_dir=/nonexistent/run", f"last={last}"]))
    assert "\n" not in str(refused.value)


def test_last_auto_refuses_auto_in_its_own_decode_settings(tmp_path):
    from transformer_mt.commands.average import average
    from transformer_mt.config import compose_job
    from transformer_mt.errors import ConfigError

    job = compose_job("average", [f"run_dir={tmp_path}", "last=auto", "decode.length_penalty=auto"])
    with pytest.raises(ConfigError, match="config key 'decode.length_penalty'"):
        average(job)
