"""Tiny random models for the search tests: fast, and sharp enough to give the search choices."""

import pytest
import torch
from torch import Tensor

from transformer_mt.config import ModelConfig
from transformer_mt.data.tokenizer import Tokenizers, train_tokenizer
from transformer_mt.data.toy import toy_pairs
from transformer_mt.model import DecoderCache, EncoderOutput, Transformer

PAD, EOS = 0, 3
TOY_VOCAB = 400  # the `tokenizers` fixture's pieces: the VOCAB of the tests that use it


class EndsNearSourceLength(Transformer):
    """A random model whose EOS logit gets `eos_bonus` once the output is as long as the source.

    Random models mostly repeat one token until the length limit; this one ends sentences of a
    batch at different steps, as trained models do, in teacher forcing and in search alike."""

    eos_bonus = 0.0

    def decode(
        self, tgt_in: Tensor, encoded: EncoderOutput, cache: DecoderCache | None = None
    ) -> Tensor:
        logits = super().decode(tgt_in, encoded, cache)  # (B, T, V)
        start = cache.length - tgt_in.shape[1] if cache is not None else 0
        generated = torch.arange(start, start + tgt_in.shape[1], device=tgt_in.device)  # (T,)
        source_lengths = encoded.src_keep.sum(dim=1, keepdim=True) - 1  # (B, 1), EOS not counted
        source_lengths = source_lengths.repeat_interleave(len(tgt_in) // len(source_lengths), 0)
        logits[..., EOS] += self.eos_bonus * (generated >= source_lengths)
        return logits


def make_random_model(
    vocab: int,
    seed: int,
    *,
    max_positions: int = 64,
    sharpen: float = 4.0,
    eos_bonus: float = 0.0,
) -> Transformer:
    """sharpen scales the shared embedding: > 1 makes the output distribution peakier, < 1
    flatter. eos_bonus > 0: an EndsNearSourceLength model."""
    torch.manual_seed(seed)
    cfg = ModelConfig(
        name="t",
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_encoder_layers=1,
        n_decoder_layers=2,
        dropout=0.0,
        max_positions=max_positions,
    )
    model = (EndsNearSourceLength if eos_bonus else Transformer)(cfg, vocab_size=vocab, pad_id=PAD)
    model.eos_bonus = eos_bonus
    with torch.no_grad():
        model.embed.weight.mul_(sharpen)
    return model.eval()


@pytest.fixture
def random_model():
    return make_random_model


@pytest.fixture(scope="session")
def tokenizers(tmp_path_factory) -> Tokenizers:
    """One SentencePiece model of TOY_VOCAB pieces trained on toy sentences, for both sides."""
    sentences = [s for pair in toy_pairs(500, seed=3) for s in pair]
    tokenizer = train_tokenizer(
        sentences, tmp_path_factory.mktemp("spm") / "spm.model", vocab_size=TOY_VOCAB
    )
    return Tokenizers(tokenizer, tokenizer)
