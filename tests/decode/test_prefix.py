"""Target prefixes: every search's output begins with its sentence's prefix and goes on from
it; a prefixed output scores as the same output found unprefixed; sentences without one in the
same batch are translated as without prefixes; through the Translator, tmt-translate's
input_prefixes and its refusal by CTranslate2."""

import math

import numpy as np
import pytest
import torch

from transformer_mt.commands.translate import source_and_prefix, translate
from transformer_mt.config import CpuLinear, DecodeConfig, compose_job
from transformer_mt.data.batching import pad_sequences
from transformer_mt.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
)
from transformer_mt.data.toy import toy_pairs
from transformer_mt.decode.sampling import sample_search
from transformer_mt.decode.search import (
    NO_TOKEN,
    WORD_NEXT,
    beam_search,
    fixed_shape_beam_search,
    greedy_search,
    length_penalty,
    max_lengths,
)
from transformer_mt.decode.translator import ModelSearch, Translator
from transformer_mt.execution import ExecutionPolicy

VOCAB = 400
IDS = {"bos_id": BOS_ID, "eos_id": EOS_ID, "unk_id": UNK_ID, "max_len_a": 1.0, "max_len_b": 4}
CPU = torch.device("cpu")
AS_SEARCHED = ExecutionPolicy.for_decoding(DecodeConfig(cpu_linear=CpuLinear.torch), CPU)


def batch(count: int = 10, seed: int = 0) -> tuple[list[list[int]], torch.Tensor]:
    rng = np.random.default_rng(seed)
    sources = [rng.integers(4, VOCAB, size=rng.integers(1, 12)).tolist() for _ in range(count)]
    return sources, pad_sequences([np.asarray(s) for s in sources], PAD_ID, suffix=EOS_ID)


def prefixes_of(count: int, seed: int = 1) -> tuple[list[list[int]], torch.Tensor]:
    """Every other sentence without a prefix; the others of 1 to 9 pieces (some longer than
    their sentence's length limit)."""
    rng = np.random.default_rng(seed)
    rows = [
        [] if i % 2 else rng.integers(4, VOCAB, size=rng.integers(1, 10)).tolist()
        for i in range(count)
    ]
    return rows, pad_sequences([np.asarray(r, dtype=np.int64) for r in rows], NO_TOKEN)


@pytest.mark.parametrize("fixed_shape", [False, True])
def test_beam_search_begins_with_each_prefix_and_scores_the_whole_output(random_model, fixed_shape):
    model = random_model(VOCAB, 0, eos_bonus=4.0)
    sources, src = batch()
    rows, prefix = prefixes_of(len(sources))
    search = fixed_shape_beam_search if fixed_shape else beam_search
    nbest = search(model, src, beam_size=3, alpha=0.6, prefix=prefix, **IDS)
    free = search(model, src, beam_size=3, alpha=0.6, **IDS)
    for hyps, wanted, unprefixed in zip(nbest, rows, free, strict=True):
        assert hyps and all(h.tokens[: len(wanted)] == wanted for h in hyps)
        if not wanted:  # as without prefixes
            assert [h.tokens for h in hyps] == [h.tokens for h in unprefixed]
    longer = [
        len(h.tokens) > len(w) for hyps, w in zip(nbest, rows, strict=True) if w for h in hyps
    ]
    assert any(longer)  # the search goes on after a prefix
    best = [hyps[0] for hyps in nbest]
    scored = ModelSearch(model, CPU).target_log_probs(
        sources, [h.tokens for h in best], AS_SEARCHED
    )
    for hypothesis, log_probs in zip(best, scored, strict=True):
        normalised = sum(log_probs) / length_penalty(len(log_probs), 0.6)
        assert math.isclose(normalised, hypothesis.score, rel_tol=1e-5, abs_tol=1e-4)


def test_greedy_search_and_sampling_begin_with_each_prefix(random_model):
    model = random_model(VOCAB, 1, eos_bonus=4.0)
    sources, src = batch(seed=2)
    rows, prefix = prefixes_of(len(sources), seed=3)
    greedy = greedy_search(model, src, prefix=prefix, **IDS)
    generator = torch.Generator().manual_seed(0)
    sampled = sample_search(model, src, generator=generator, prefix=prefix, **IDS)
    scored = ModelSearch(model, CPU).target_log_probs(
        sources, [h.tokens for h in greedy], AS_SEARCHED
    )
    for found, draw, wanted, log_probs in zip(greedy, sampled, rows, scored, strict=True):
        assert found.tokens[: len(wanted)] == wanted and draw.tokens[: len(wanted)] == wanted
        assert math.isclose(sum(log_probs), found.score, rel_tol=1e-5, abs_tol=1e-4)


def test_a_translation_begins_with_its_prefix_text(random_model, tokenizers):
    model = random_model(VOCAB, 2, eos_bonus=4.0)
    translator = Translator.for_model(model, tokenizers, DecodeConfig(max_len_b=3, nbest=2), CPU)
    pairs = toy_pairs(8, seed=4)
    sources = [src for src, _ in pairs] + [""]
    prefixes = [" ".join(tgt.split()[:2]) if i % 3 else "" for i, (_, tgt) in enumerate(pairs)]
    found = translator.translate_nbest(sources, prefixes=[*prefixes, "ignored"])
    for entries, prefix in zip(found, prefixes, strict=False):
        assert all(entry.text.startswith(prefix) for entry in entries)
    assert found[-1][0].text == ""  # an empty line is not translated, whatever its prefix
    assert source_and_prefix("a\tb\tc") == ("a\tb", "c") and source_and_prefix("a") == ("a", "")


def test_tmt_translate_reads_a_prefix_after_a_tab(one_update_run, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("the dog sees two cats .\tDer Hund\nthe cat sleeps .\n", encoding="utf-8")
    output = tmp_path / "out.txt"
    job = compose_job(
        "translate",
        [f"run_dir={one_update_run}", f"input={source}", f"output={output}"]
        + ["input_prefixes=true", "decode.max_len_a=0", "decode.max_len_b=5", "device=cpu"],
    )
    translate(job)
    outputs = output.read_text(encoding="utf-8").splitlines()
    assert len(outputs) == 2 and outputs[0].startswith("Der Hund")


def test_a_prefix_of_the_beam_s_own_output_gives_the_same_output(random_model):
    """The prefixed search explores only continuations of the prefix, all K beams of them: with
    the unprefixed best's first pieces as the prefix it finds that output again, at its score."""
    model = random_model(VOCAB, 4, eos_bonus=4.0)
    sources, src = batch(12, seed=5)
    free = beam_search(model, src, beam_size=4, alpha=0.6, **IDS)
    rows = [hyps[0].tokens[:2] for hyps in free]
    prefix = pad_sequences([np.asarray(r, dtype=np.int64) for r in rows], NO_TOKEN)
    prefixed = beam_search(model, src, beam_size=4, alpha=0.6, prefix=prefix, **IDS)
    assert any(len(hyps[0].tokens) > 2 for hyps in free)
    for unprefixed, found in zip(free, prefixed, strict=True):
        assert found[0].tokens == unprefixed[0].tokens
        assert math.isclose(found[0].score, unprefixed[0].score, rel_tol=1e-5, abs_tol=1e-4)


def word_next_prefixes(rows: list[list[int]]) -> torch.Tensor:
    """Each non-empty prefix of `rows` followed by WORD_NEXT (it ended in a space)."""
    marked = [[*r, WORD_NEXT] if r else r for r in rows]
    return pad_sequences([np.asarray(r, dtype=np.int64) for r in marked], NO_TOKEN)


def next_tokens(found: list, rows: list[list[int]]) -> list[int]:
    """The token after each prefix (EOS where the output ends there), of prefixed sentences."""
    return [
        (h.tokens[len(w)] if len(h.tokens) > len(w) else EOS_ID)
        for hyps, w in zip(found, rows, strict=True)
        if w
        for h in (hyps if isinstance(hyps, list) else [hyps])
    ]


def test_after_a_prefix_that_ends_in_a_space_every_search_begins_a_word(random_model):
    model = random_model(VOCAB, 6, eos_bonus=4.0)
    sources, src = batch(16, seed=7)
    rows, _ = prefixes_of(len(sources), seed=8)
    starts = torch.zeros(VOCAB, dtype=torch.bool)
    starts[torch.randperm(VOCAB, generator=torch.Generator().manual_seed(0))[: VOCAB // 8]] = True
    starts[EOS_ID] = True
    marked = word_next_prefixes(rows)
    generator = torch.Generator().manual_seed(0)
    searches = {
        "beam": lambda **p: beam_search(model, src, beam_size=3, alpha=0.6, **p, **IDS),
        "fixed": lambda **p: fixed_shape_beam_search(model, src, beam_size=3, **p, **IDS),
        "greedy": lambda **p: greedy_search(model, src, **p, **IDS),
        "sample": lambda **p: sample_search(model, src, generator=generator, **p, **IDS),
    }
    for name, search in searches.items():
        found = search(prefix=marked, word_starts=starts)
        nbest = [hyps if isinstance(hyps, list) else [hyps] for hyps in found]
        for hyps, wanted in zip(nbest, rows, strict=True):
            assert hyps and all(h.tokens[: len(wanted)] == wanted for h in hyps), name
        assert all(starts[token] for token in next_tokens(found, rows)), name
    # without the mark the same searches go on with pieces that do not begin a word: the test
    # can fail
    _, plain = prefixes_of(len(sources), seed=8)
    free = next_tokens(searches["greedy"](prefix=plain, word_starts=starts), rows)
    assert not all(starts[token] for token in free)


def test_a_prefix_text_that_ends_in_a_space_ends_its_word(random_model, tokenizers):
    model = random_model(VOCAB, 7, eos_bonus=4.0)
    translator = Translator.for_model(model, tokenizers, DecodeConfig(max_len_b=4), CPU)
    words = ["the dog", "the dog ", "", " "]
    encoded = translator.encode_prefixes(words)
    plain = translator.encode_targets(["the dog"])[0]
    assert encoded == [plain, [*plain, WORD_NEXT], [], []]
    sources = [src for src, _ in toy_pairs(12, seed=5)]
    found = translator.translate_nbest(sources, prefixes=["the dog "] * len(sources))
    for entries in found:
        assert all(e.text == "the dog" or e.text.startswith("the dog ") for e in entries)


def test_the_length_limit_counts_a_prefix_s_pieces_not_its_word_mark():
    keep = torch.ones(1, 2, dtype=torch.bool)  # a source of one piece and EOS: limit 0 * 1 + 1
    for prefix, limit in (([5, 6, 7], 4), ([5, 6, 7, WORD_NEXT], 4), ([5, NO_TOKEN], 2)):
        assert max_lengths(keep, 0.0, 1, torch.tensor([prefix])).tolist() == [limit]
