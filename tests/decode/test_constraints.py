"""Lexically constrained beam search (decode/constraints.py): every finished hypothesis holds
each of its sentence's target terms, in both batch shapes and with an ensemble; sentences
without terms are searched as without; a term that cannot fit within the length limit leaves
the sentence to an unconstrained search, marked; glossaries through the Translator, in fp32,
bf16 and int8, and what the greedy search and bad glossaries get."""

import re

import numpy as np
import pytest
import torch

from transformer_mt.commands.evaluate import evaluate
from transformer_mt.commands.translate import translate
from transformer_mt.config import CpuLinear, DecodeConfig, Precision, Strategy, compose_job
from transformer_mt.data.batching import pad_sequences
from transformer_mt.data.sources import read_pairs
from transformer_mt.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
)
from transformer_mt.decode.constraints import (
    MAX_TERM_PIECES,
    MAX_TERMS,
    ConstraintState,
    Terms,
    advanced_state,
    beyond_search,
    round_robin_order,
    term_candidates,
    word_end_pieces,
)
from transformer_mt.decode.glossary import Glossary, occurrences
from transformer_mt.decode.search import Ensemble, beam_search, fixed_shape_beam_search
from transformer_mt.decode.translator import ModelSearch, Translator
from transformer_mt.errors import ConfigError, DataError
from transformer_mt.run_dir import RunDir

VOCAB = 400
IDS = {"bos_id": BOS_ID, "eos_id": EOS_ID, "unk_id": UNK_ID, "max_len_a": 1.0, "max_len_b": 6}
CPU = torch.device("cpu")


def contains(tokens: list[int], term: list[int]) -> bool:
    return any(tokens[i : i + len(term)] == term for i in range(len(tokens) - len(term) + 1))


def test_the_banks_take_turns_best_first():
    """Banks 2, 1, 0 (top bank 2): each bank's best, highest bank first, then the second
    best of each; -inf last."""
    scores = torch.tensor([[-1.0, -2.0, -3.0, -0.5, -4.0, -torch.inf, -0.1]])
    banks = torch.tensor([[0, 1, 2, 0, 2, 2, 1]])
    order = round_robin_order(scores, banks, torch.tensor([2]))
    # bank 2: -3.0 (2), -4.0 (4); bank 1: -0.1 (6), -2.0 (1); bank 0: -0.5 (3), -1.0 (0)
    assert order.tolist() == [[2, 6, 3, 4, 1, 0, 5]]


def test_a_piece_advances_starts_completes_or_drops_a_term():
    """Terms: [7, 8, 9] and [5]; rows: none in progress; [7, 8] written of the first."""
    terms = Terms.of_ids([[[7, 8, 9], [5]]], CPU)
    state = ConstraintState(
        met=torch.tensor([[False, False], [False, False]]),
        current=torch.tensor([-1, 0]),
        written=torch.tensor([0, 2]),
        pending=torch.tensor([-1, -1]),
    )
    origin = torch.tensor([[0, 0, 1, 1, 1]])
    tokens = torch.tensor([[7, 5, 9, 7, 4]])
    after, banks = advanced_state(state, origin, tokens, terms, beams=2)
    assert after.current.tolist() == [0, -1, -1, 0, -1]
    assert after.written.tolist() == [1, 0, 0, 1, 0]
    assert after.met.tolist() == [[0, 0], [0, 1], [1, 0], [0, 0], [0, 0]]
    # 7 starts term 0; 5 completes term 1; 9 completes term 0; 7 after [7, 8] starts it anew
    assert banks.tolist() == [[1, 1, 3, 1, 0]]


def test_a_term_is_met_where_its_word_ends_and_dropped_where_it_goes_on():
    """Term [7, 8]; pieces 5 and EOS may end a word, 9 may not. Rows: [7] written; [7, 8]
    written, pending."""
    word_ends = torch.zeros(VOCAB, dtype=torch.bool)
    word_ends[[5, EOS_ID]] = True
    terms = Terms.of_ids([[[7, 8]]], CPU, word_ends)
    state = ConstraintState(
        met=torch.tensor([[False], [False]]),
        current=torch.tensor([0, -1]),
        written=torch.tensor([1, 0]),
        pending=torch.tensor([-1, 0]),
    )
    assert state.complete(terms.lengths, 2).tolist() == [False, True]  # EOS may end its word
    origin = torch.tensor([[0, 1, 1, 1]])
    tokens = torch.tensor([[8, 5, 9, EOS_ID]])
    after, banks = advanced_state(state, origin, tokens, terms, beams=2)
    assert after.pending.tolist() == [0, -1, -1, -1]
    assert after.met.tolist() == [[False], [True], [False], [True]]
    assert banks.tolist() == [[2, 2, 0, 2]]  # 9 after the term: its pieces no longer count
    candidates = term_candidates(
        torch.zeros(1, 2, VOCAB), torch.zeros(1, 2), state, terms, torch.zeros(1, 2, 0).long()
    )
    assert candidates[1].tolist() == [[[8], [7]]] and candidates[0][0, 1, 0] == -torch.inf


def test_pieces_that_may_end_a_word_begin_one_or_with_no_letter_or_digit():
    pieces = ["<pad>", "<unk>", "<s>", "</s>", "▁Land", "wirt", "e", ".", "-", "<0xC3>", "▁"]
    ends = word_end_pieces(pieces, EOS_ID, 12).tolist()
    assert ends == [False, False, False, True, True, False, False, True, True, False, True, False]


def sources(count: int = 10, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    lines = [rng.integers(4, VOCAB, size=rng.integers(3, 12)) for _ in range(count)]
    return pad_sequences(lines, PAD_ID, suffix=EOS_ID)


def random_terms(count: int, seed: int = 1) -> list[list[list[int]]]:
    """Every third sentence without terms; the others one or two terms of one to three
    pieces."""
    rng = np.random.default_rng(seed)
    return [
        []
        if i % 3 == 0
        else [rng.integers(4, VOCAB, size=rng.integers(1, 4)).tolist() for _ in range(i % 2 + 1)]
        for i in range(count)
    ]


@pytest.mark.parametrize("members", [1, 2])
def test_every_finished_hypothesis_holds_its_terms_in_both_batch_shapes(random_model, members):
    model = Ensemble([random_model(VOCAB, seed, eos_bonus=4.0) for seed in range(members)])
    src = sources()
    wanted = random_terms(len(src))
    terms = Terms.of_ids(wanted, CPU)
    search = {"beam_size": 4, "alpha": 0.6, "terms": terms, **IDS}
    shrinking = beam_search(model, src, **search)
    fixed = fixed_shape_beam_search(model, src, check_every=1, **search)
    free = beam_search(model, src, beam_size=4, alpha=0.6, **IDS)
    met = 0
    for hyps, fixed_hyps, unconstrained, sentence_terms in zip(
        shrinking, fixed, free, wanted, strict=True
    ):
        assert [h.tokens for h in hyps] == [h.tokens for h in fixed_hyps]
        assert np.allclose([h.score for h in hyps], [h.score for h in fixed_hyps], atol=1e-4)
        for hypothesis in hyps:
            assert all(contains(hypothesis.tokens, term) for term in sentence_terms)
        if not sentence_terms:
            assert [h.tokens for h in hyps] == [h.tokens for h in unconstrained]
        met += bool(sentence_terms and hyps)
    assert met >= 4  # most sentences with terms find hypotheses that hold them


def test_terms_beyond_the_search_are_over_its_limits_of_count_pieces_or_length():
    assert not beyond_search([[5, 6], [7]], 4, 1.0, 6)  # 3 pieces, limit 10
    assert beyond_search([[5]] * (MAX_TERMS + 1), 100, 1.0, 50)
    assert beyond_search([list(range(5, 6 + MAX_TERM_PIECES))], 100, 1.0, 50)
    assert beyond_search([[5, 6, 7], [8, 9, 10]], 2, 1.0, 4)  # 6 pieces, limit 6: no room for EOS


def test_a_term_longer_than_the_limit_leaves_its_sentence_unconstrained_and_marked(random_model):
    model = random_model(VOCAB, 3, eos_bonus=4.0)
    src = sources(4, seed=2)
    too_long = list(range(10, 30))  # 20 pieces: over any of these sentences' limits
    wanted = [[too_long], [], [[11]], []]
    found = beam_search(model, src, beam_size=3, terms=Terms.of_ids(wanted, CPU), **IDS)
    assert found[0] == []  # the search itself finds none
    backend = ModelSearch(model, CPU)
    decode = DecodeConfig(beam_size=3, max_len_a=1.0, max_len_b=6, cpu_linear=CpuLinear.torch)
    ids = [row[row != PAD_ID][:-1].tolist() for row in src]
    results = backend.search(ids, decode, terms=wanted)
    unconstrained = backend.search(ids, decode)
    assert results[0] and all(h.unmet_terms for h in results[0])
    assert [h.tokens for h in results[0]] == [h.tokens for h in unconstrained[0]]
    assert not any(h.unmet_terms for hyps in results[1:] for h in hyps)


def test_glossary_matches_whole_words_longest_first_without_overlaps():
    glossary = Glossary.of_pairs(
        [("car", "Auto"), ("red car", "rotes Auto"), ("Dog", "Hund"), ("car park", "Parkplatz")],
        None,
    )
    assert glossary.terms("The red car.", None) == ["rotes Auto"]
    assert glossary.terms("the car and the red car", None) == ["Auto", "rotes Auto"]
    assert glossary.terms("a DOG, a dogma, a dog-friendly car park", None) == ["Hund", "Parkplatz"]
    assert glossary.terms("the red car park", None) == ["Parkplatz"]  # the longer of the two
    assert glossary.terms("dogma", None) == []


@pytest.mark.parametrize(
    "settings",
    [{}, {"precision": Precision.bf16}, {"quantize": CpuLinear.int8}],
    ids=["fp32", "bf16", "int8"],
)
def test_a_glossary_s_target_terms_are_in_each_translation(
    random_model, tokenizers, tmp_path, settings
):
    glossary = tmp_path / "terms.tsv"
    glossary.write_text("# term pairs\ndog\tHund\nred car\trotes Auto\n\nCAT\tKatze\n")
    model = random_model(VOCAB, 5, eos_bonus=4.0)
    decode = DecodeConfig(max_len_a=1.0, max_len_b=8, glossary=str(glossary), **settings)
    translator = Translator.for_model(model, tokenizers, decode, CPU)
    sentences = ["the dog sees the red car .", "a cat sleeps .", "dogma ."]
    found = translator.translate_nbest(sentences)
    assert not any(h.unmet_terms for nbest in found for h in nbest)
    wanted = [["Hund", "rotes Auto"], ["Katze"]]  # Katze: "cat" matched up to case
    for nbest, terms in zip(found[:2], wanted, strict=True):
        for hypothesis in nbest:  # each term whole, never the start of a longer word
            assert all(re.search(rf"(^| ){term}($|[^\w])", hypothesis.text) for term in terms)
    assert translator.line_terms(["dogma ."]) is None  # not inside a longer word
    assert translator.translate(sentences) == [nbest[0].text for nbest in found]


def test_greedy_search_and_bad_glossaries_are_refused_in_one_line(
    random_model, tokenizers, tmp_path
):
    glossary = tmp_path / "terms.tsv"
    glossary.write_text("dog\tHund\n")
    with pytest.raises(ConfigError, match="'decode.glossary': target terms need beam search"):
        DecodeConfig(strategy=Strategy.greedy, glossary=str(glossary)).validate()
    with pytest.raises(ConfigError, match="'decode.glossary': target terms need .*beam_size >= 2"):
        DecodeConfig(beam_size=1, nbest=1, glossary=str(glossary)).validate()
    model = random_model(VOCAB, 6)
    greedy = Translator.for_model(model, tokenizers, DecodeConfig(strategy=Strategy.greedy), CPU)
    with pytest.raises(ConfigError, match="'decode.strategy': target terms"):
        greedy.translate_nbest(["the dog ."], terms=[["Hund"]])
    one_beam = Translator.for_model(model, tokenizers, DecodeConfig(beam_size=1, nbest=1), CPU)
    with pytest.raises(ConfigError, match="'decode.strategy': target terms need .*beam_size >= 2"):
        one_beam.translate_nbest(["the dog ."], terms=[["Hund"]])
    broken = tmp_path / "broken.tsv"
    broken.write_text("dog\tHund\ncat Katze\n")
    translator = Translator.for_model(model, tokenizers, DecodeConfig(glossary=str(broken)), CPU)
    with pytest.raises(DataError, match=r"broken.tsv:2: a glossary line is a source term, a tab"):
        translator.translate(["the dog ."])
    missing = DecodeConfig(glossary=str(tmp_path / "missing.tsv"))
    with pytest.raises(ConfigError, match="'decode.glossary': .*missing.tsv"):
        Translator.for_model(model, tokenizers, missing, CPU).translate(["the dog ."])


def test_tmt_translate_and_tmt_eval_name_the_lines_translated_without_their_terms(
    one_update_run, tmp_path, caplog
):
    """A term of five words cannot fit within a limit of four pieces: the line is translated
    without it, named in a warning; tmt-eval counts such lines."""
    glossary = tmp_path / "terms.tsv"
    glossary.write_text("the\tder Hund sieht die Katze\n", encoding="utf-8")
    source = tmp_path / "in.txt"
    source.write_text("a cat .\nthe dog sleeps .\n", encoding="utf-8")
    output = tmp_path / "out.txt"
    short = ["decode.max_len_a=0", "decode.max_len_b=4", "device=cpu"]
    job = compose_job(
        "translate",
        [f"run_dir={one_update_run}", f"input={source}", f"output={output}"]
        + [f"decode.glossary={glossary}", *short],
    )
    with caplog.at_level("WARNING"):
        translate(job)
    assert len(output.read_text(encoding="utf-8").splitlines()) == 2
    warned = [r.getMessage() for r in caplog.records if "without its target terms" in r.message]
    assert warned == [
        f"{source}:2: translated without its target terms: no hypothesis met them "
        "all within the length limit"
    ]
    report = evaluate(
        compose_job("eval", [f"run_dir={one_update_run}", f"decode.glossary={glossary}", *short])
    )
    data = RunDir(one_update_run).data_config()
    with_the = sum(bool(occurrences(s.casefold(), "the")) for s, _ in read_pairs(data, "test"))
    assert with_the > 0 and report.unmet_terms == with_the
    assert report.to_json()["unmet_terms"] == with_the
