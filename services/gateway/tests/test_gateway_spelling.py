"""The query speller (domain/spelling.py) over a small word list, and over the real English
list the gateway loads (adapters/word_frequencies.py)."""

from __future__ import annotations

import pytest

from hippo_gateway.adapters.word_frequencies import english_word_counts
from hippo_gateway.domain.spelling import QuerySpeller

COUNTS = {
    "what": 900, "is": 950, "the": 999, "status": 40, "relationship": 60, "research": 50,
    "reach": 80, "did": 700, "group": 300, "grout": 2, "caroline": 30, "hoodie": 5,
    "goodies": 9, "bake": 20, "baked": 3, "cake": 40, "make": 400, "lake": 30,
}  # fmt: skip


@pytest.fixture
def speller() -> QuerySpeller:
    return QuerySpeller(COUNTS)


def test_a_slip_becomes_the_most_frequent_listed_word_one_edit_away(speller) -> None:  # type: ignore[no-untyped-def]
    assert speller.correct("what is the relatioonship status") == (
        "what is the relationship status"
    )
    assert speller.correct("what did caroline reserch") == "what did caroline research"
    # "gorup" is one edit from "group" and from nothing else listed.
    assert speller.correct("the support gorup") == "the support group"
    # "nake" is one edit from make, cake, lake and bake: the most frequent wins.
    assert speller.correct("nake") == "make"
    assert speller.correct("ake") == "ake"  # under four letters: left alone


def test_spell_names_each_repair_by_the_word_as_typed(speller) -> None:  # type: ignore[no-untyped-def]
    """What the retrieval service gets beside the typed query (QuerySpelling "words"):
    lower-case typed word -> lower-case repair, nothing for a word left as typed."""
    assert speller.spell("Reserch the gorup, Caroline!") == (
        "Research the group, Caroline!",
        {"reserch": "research", "gorup": "group"},
    )
    assert speller.spell("what is the status") == ("what is the status", {})
    assert speller.spell("zzzzqq handleSubmit( LGBTQ") == ("zzzzqq handleSubmit( LGBTQ", {})


def test_known_words_short_words_and_unfixable_words_stay_as_typed(speller) -> None:  # type: ignore[no-untyped-def]
    clean = "What is the relationship status?"
    assert speller.correct(clean) == clean  # nothing to repair: the text is untouched
    assert speller.correct("wat is teh status") == "wat is teh status"  # 3 letters: meant
    assert speller.correct("zzzzqq status") == "zzzzqq status"  # no listed neighbour
    # An inflection of a listed word is known: "hoodies" is not "goodies".
    assert speller.correct("the hoodies") == "the hoodies"
    assert speller.correct("baking cakes") == "baking cakes"


def test_names_numbers_apostrophes_and_other_scripts_are_left_alone(speller) -> None:  # type: ignore[no-untyped-def]
    # Capitalised inside a sentence: a name the list may not hold.
    assert speller.correct("did Carolne go") == "did Carolne go"
    # ... but the first word of a sentence is an ordinary word.
    assert speller.correct("Whar is it. Reserch it") == "What is it. Research it"
    assert speller.correct("the 18th reserch2 café grup's") == "the 18th reserch2 café grup's"
    # Identifiers keep their exact form (BM25 matches them as typed).
    code = "src/app/reserch.py handleReserch reserch_id gorup() GORUP a-reserch"
    assert speller.correct(code) == code
    # Sentence punctuation around a plain word is kept around its repair.
    assert speller.correct('the "gorup", (reserch)?') == 'the "group", (research)?'


def test_repairs_are_cached_and_the_cache_is_bounded(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import hippo_gateway.domain.spelling as spelling

    monkeypatch.setattr(spelling, "CACHE_SIZE", 3)
    speller = QuerySpeller(COUNTS)
    calls = []
    original = spelling.one_edit
    monkeypatch.setattr(spelling, "one_edit", lambda w: calls.append(w) or original(w))
    assert speller.correct("reserch reserch") == "research research"
    assert calls == ["reserch"]
    speller.correct("gorup zzzzqq relatioonship statsu")  # overflows the cache: cleared
    assert len(speller._cache) <= 3


def test_the_english_list_repairs_common_slips_and_keeps_names() -> None:
    counts = english_word_counts()
    assert len(counts) > 40_000 and counts["the"] > counts["relationship"] > 0
    speller = QuerySpeller(counts)
    typed = "remind me wat is melanies relatioonship status and her birthdsy"
    assert speller.correct(typed) == (
        "remind me wat is melanies relationship status and her birthday"
    )
    clean = "When did Caroline go to the LGBTQ support group in Boston?"
    assert speller.correct(clean) == clean
    # Words a smaller, older list lacks, each one edit from one it holds: British
    # spellings, chat words, newer words. None is "repaired".
    kept = "colour favourite organise centre bday lmao haha covid wifi uber keto zumba meds"
    assert speller.correct(kept) == kept


def test_a_query_of_noise_costs_a_bounded_number_of_repairs(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import hippo_gateway.domain.spelling as spelling

    speller = QuerySpeller(COUNTS)
    calls = []
    original = spelling.one_edit
    monkeypatch.setattr(spelling, "one_edit", lambda w: calls.append(w) or original(w))
    noise = " ".join(f"qx{chr(97 + i % 26)}{chr(97 + i // 26)}zv" for i in range(300))
    assert speller.correct(noise + " reserch") == noise + " reserch"  # past the budget
    assert len(calls) == spelling.MAX_REPAIRS
    assert speller.correct("x" * 21 + "s") == "x" * 21 + "s"  # too long to be a slip
    assert len(calls) == spelling.MAX_REPAIRS


def test_a_missing_word_list_names_the_package_and_the_setting(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import hippo_gateway.adapters.word_frequencies as word_frequencies

    monkeypatch.setattr(word_frequencies, "PACKAGE", "no_such_package_here")
    with pytest.raises(RuntimeError, match=r"wordfreq.*HIPPO_GATEWAY_QUERY_SPELLING=off"):
        word_frequencies.english_word_counts()
