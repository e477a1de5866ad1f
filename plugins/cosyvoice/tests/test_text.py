"""Text normalisation before the LLM (wetext, with the official front end's choice of grammar)."""

from __future__ import annotations

import sys

import pytest
from trtdeploy_cosyvoice.text import TextNormalizer, is_chinese


@pytest.fixture(scope="module")
def normalize():
    return TextNormalizer()


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("The phone costs 5499 dollars and weighs 5g.",
         "The phone costs five thousand four hundred and ninety nine dollars and weighs five grams."),
        ("Meet me on 3/4/2024 at 10:30.", "Meet me on the fourth of march twenty twenty four at ten thirty."),
        ("5499", "五千四百九十九"),
        ("售价5499元。", "售价五千四百九十九元。"),
        ("No digits here.", "No digits here."),
        ("", ""),
    ],
)  # fmt: skip
def test_numbers_dates_and_units_are_written_out(normalize, text, spoken):
    assert normalize(text) == spoken


def test_the_grammar_is_chosen_as_the_official_front_end_does():
    assert is_chinese("今天是5号") and is_chinese("  2024 ") and not is_chinese("It is 2024.")


def test_without_wetext_text_passes_unchanged(monkeypatch):
    monkeypatch.setitem(sys.modules, "wetext", None)  # import wetext now raises ImportError
    normalize = TextNormalizer()
    assert not normalize.available and normalize("It costs 5499 dollars.") == "It costs 5499 dollars."
