"""ProStream's fact extraction (streammem.recipes.prostream.extract) against hand-labelled sentences.

The sentences below are written for these tests, not taken from the synthetic
stream's templates: assertions in several constructions (each labelled with the
triple a reader takes from it), and sentences that name an entity and an
attribute, often with a value, without asserting it (questions, negations,
modals, conditions, doubt, chatter), which must yield nothing.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from streammem.recipes.prostream import Fact, FactExtractor, ModelExtractor, PatternExtractor, fact_key
from streammem.recipes.prostream.extract import check_facts

ASSERTED = [
    ("Marlow's home city is Lisbon.", [("Marlow", "home city", "Lisbon")]),
    ("Okay, so Quentin's dentist is Dr Moreau.", [("Quentin", "dentist", "Dr Moreau")]),
    ("Ysolde's favourite colour was teal.", [("Ysolde", "favourite colour", "teal")]),
    ("Bertil's new bike is a Canyon now.", [("Bertil", "new bike", "Canyon")]),
    ("Calla's locker number has been 4401 since March.", [("Calla", "locker number", "4401")]),
    ("Anyway, Dashiell's gym: Forge.", [("Dashiell", "gym", "Forge")]),
    ("The landlord of Elowen is Mr Abernathy.", [("Elowen", "landlord", "Mr Abernathy")]),
    ("Fenwick mentioned that his barber is Sal.", [("Fenwick", "barber", "Sal")]),
    ("Greer told Hollis that her flight gate is C7.", [("Greer", "flight gate", "C7")]),
    ("Ingrid switched her phone provider to Telia.", [("Ingrid", "phone provider", "Telia")]),
    ("Jasper got a new manager, Nakamura.", [("Jasper", "manager", "Nakamura")]),
    ("Tallinn is Kestrel's home city these days.", [("Kestrel", "home city", "Tallinn")]),
    ("Linnea's car is a Skoda and Magnus's gym is Pulse.", [("Linnea", "car", "Skoda"), ("Magnus", "gym", "Pulse")]),
    ("We had lunch. Nerys's project codename is Nimbus!", [("Nerys", "project codename", "Nimbus")]),
    ("Orla’s desk is 12B.", [("Orla", "desk", "12B")]),
    ("Aunt May's car is still the blue Fiat.", [("Aunt May", "car", "blue Fiat")]),
]

NOT_ASSERTED = [
    "What is Marlow's home city?",
    "Is Quentin's dentist still Dr Moreau?",
    "Marlow's home city is not Oslo.",
    "Marlow's home city isn't Oslo anymore.",
    "Quentin's gym is no longer Pulse.",
    "If Bertil's car were a Volvo, he would say so.",
    "Bertil might change his car to a Volvo.",
    "Maybe Calla's locker number will be 12 next term.",
    "I doubt Dashiell's gym is Forge.",
    "Perhaps Elowen's landlord is Mr Abernathy.",
    "Nobody thinks Fenwick's barber is Sal.",
    "Greer and Hollis met in Oslo at 7 pm.",
    "She changed her car to a Volvo.",
    "garlic with pasta, then oven.",
    "Jasper keeps talking about his manager.",
]


@pytest.fixture(scope="module")
def extractor():
    return PatternExtractor()


@pytest.mark.parametrize("text, expected", ASSERTED)
def test_assertions_yield_their_triples(extractor, text, expected):
    facts = extractor.extract(text)
    assert [(f.entity, f.attribute, f.value) for f in facts] == expected


@pytest.mark.parametrize("text", NOT_ASSERTED)
def test_questions_negations_modals_and_chatter_yield_nothing(extractor, text):
    assert extractor.extract(text) == []


def test_a_later_negation_does_not_cancel_an_earlier_assertion(extractor):
    assert [f.value for f in extractor.extract("Marlow's car is a Fiat, not a Volvo.")] == ["Fiat"]


def test_keys_normalise_case_spacing_apostrophes_and_qualifiers():
    assert fact_key("Marlow", "Home  City") == ("marlow", "home city")
    assert fact_key("Aunt  May", "their new car") == ("aunt may", "car")
    assert fact_key("O’Brien", "car") == ("o'brien", "car")
    assert fact_key("Marlow", "new") == ("marlow", "new")  # a qualifier alone is the attribute
    assert Fact("Marlow", "the car", "Fiat").key == fact_key("marlow", "car")
    # Same attribute, different entities: different keys (they never supersede each other).
    assert Fact("Kestrel", "flight gate", "A3").key != Fact("Peregrine", "flight gate", "F9").key


def test_mentions_are_capitalised_runs_without_function_words(extractor):
    assert extractor.mentions("Remind me, what is Marlow's car?") == ["Marlow"]
    assert extractor.mentions("What's the gym of Dr Osei?") == ["Dr Osei"]
    assert extractor.mentions("So Marlow and Quentin went to Oslo.") == ["Marlow", "Quentin", "Oslo"]
    assert extractor.mentions("nothing here") == []


def test_the_default_is_a_fact_extractor_and_rejects_non_text(extractor):
    assert isinstance(extractor, FactExtractor)
    for method in (extractor.extract, extractor.mentions):
        with pytest.raises(ValueError, match="text must be a string"):
            method(None)


def test_extractor_output_is_validated():
    assert check_facts([("Marlow", "car", "Fiat")], "x") == [Fact("Marlow", "car", "Fiat")]
    for bad, match in ((None, "list of Fact"), ("Marlow's car", "list of Fact"), ([("a", "b")], r"x\[0\] must be"),
                       ([Fact("", "car", "Fiat")], r"x\[0\]\.entity"), ([Fact("M", "car", " ")], r"x\[0\]\.value")):
        with pytest.raises(ValueError, match=match):
            check_facts(bad, "x")


def test_model_extractor_parses_the_models_lines_and_ignores_the_rest():
    prompts = []

    def generate(prompt):
        prompts.append(prompt)
        return ("Sure! Here are the facts:\n- Marlow | home city | Lisbon\nMarlow | Home City | Lisbon\n"
                "Quentin | car\nnone") if "Lisbon" in prompt else "none"

    extractor = ModelExtractor(generate)
    assert isinstance(extractor, FactExtractor)
    assert extractor.extract("Marlow moved to Lisbon last spring.") == [Fact("Marlow", "home city", "Lisbon")]
    assert "Line: Marlow moved to Lisbon last spring." in prompts[0]
    assert extractor.extract("Rain again.") == []
    assert extractor.mentions("Where does Marlow live?") == ["Marlow"]
    for bad, match in ((lambda: ModelExtractor("no"), "generate must be callable"),
                       (lambda: ModelExtractor(generate, prompt="no slot"), "prompt must contain"),
                       (lambda: ModelExtractor(lambda p: None).extract("x"), "must return a string")):
        with pytest.raises(ValueError, match=match):
            bad()


def test_the_design_notes_extractor_example_runs_and_prints_what_they_say(capsys):
    """docs/recipes/prostream.md's extractor example: the default extractor, a user's own, a stand-in model."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "recipes" / "prostream.md").read_text()
    section = doc.split("<!-- example:extractor -->", 1)[1].split("<!-- end example:extractor -->", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    printed = doc.split("It prints:\n\n```\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/recipes/prostream.md (extractor example)", "exec"), {})
    assert capsys.readouterr().out == printed
