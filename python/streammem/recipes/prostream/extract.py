"""Facts out of turns: (entity, attribute, value) triples, the key that supersession compares, and the
model-free default extractor.

ProStream keys its long-term memory on entities and what is said about them (the paper extracts them
with GLiNER).  An extractor turns a dialogue turn into :class:`Fact` objects and names the entities a
question mentions; :func:`fact_key` reduces a fact to the (entity, attribute) key under which a newer
statement supersedes an older one.  Anything with ``extract(text)`` and ``mentions(text)`` plugs in
(:class:`FactExtractor`): a model-based extractor (GLiNER, a relation-extraction model, a language
model prompted for triples) replaces the default :class:`PatternExtractor`, which reads a handful of
English constructions with regular expressions and needs no model.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, runtime_checkable

__all__ = ["Fact", "FactExtractor", "PatternExtractor", "ModelExtractor", "fact_key", "check_facts"]


@dataclass(frozen=True)
class Fact:
    """One statement of a turn: ``entity``'s ``attribute`` is ``value``.

    Strings as written in the turn; :func:`fact_key` normalises entity and
    attribute into the key under which a newer statement supersedes this one.
    """

    entity: str
    attribute: str
    value: str

    @property
    def key(self) -> tuple[str, str]:
        return fact_key(self.entity, self.attribute)


@runtime_checkable
class FactExtractor(Protocol):
    """Turns text into facts, and finds the entities a question names.

    ``extract(text)`` returns the facts a turn asserts (none for questions,
    negations, hypotheticals and chatter); ``mentions(text)`` returns the
    entity names a text mentions, as written (ProStream looks them up with
    :func:`fact_key`'s normalisation, so over-reporting costs nothing but a
    dictionary look-up).  Both are called on the stream's thread.
    """

    def extract(self, text: str) -> Sequence[Fact]: ...

    def mentions(self, text: str) -> Sequence[str]: ...


_SPACE = re.compile(r"\s+")
# Words that qualify the attribute rather than name it ("Marlow's new car" is the car).
_ATTRIBUTE_QUALIFIERS = {"the", "a", "an", "his", "her", "their", "its", "my", "our", "your", "new", "current",
                         "latest", "present", "usual", "old", "previous"}


def fact_key(entity: str, attribute: str) -> tuple[str, str]:
    """The (entity, attribute) key of a fact: lower case, single spaces, curly apostrophes straightened,
    leading determiners and qualifiers of the attribute dropped ("their new car" -> "car").

    Two statements supersede one another exactly when their keys are equal.
    """
    entity = _SPACE.sub(" ", entity.replace("’", "'")).strip().lower()
    words = _SPACE.sub(" ", attribute.replace("’", "'")).strip().lower().split(" ")
    while len(words) > 1 and words[0] in _ATTRIBUTE_QUALIFIERS:
        words.pop(0)
    return entity, " ".join(words)


def check_facts(out, where: str) -> list[Fact]:
    """Validate an extractor's output: Fact objects (or (entity, attribute, value) string triples) with
    non-empty fields; raises ValueError naming ``where``."""
    if isinstance(out, (str, bytes)) or not isinstance(out, (list, tuple)):
        raise ValueError(f"{where} must return a list of Fact objects, got {type(out).__name__}")
    facts = []
    for i, item in enumerate(out):
        if isinstance(item, tuple) and not isinstance(item, Fact) and len(item) == 3:
            item = Fact(*item)
        if not isinstance(item, Fact):
            raise ValueError(f"{where}[{i}] must be a Fact or an (entity, attribute, value) triple, got {item!r}")
        for name in ("entity", "attribute", "value"):
            value = getattr(item, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{where}[{i}].{name} must be a non-empty string, got {value!r}")
        facts.append(item)
    return facts


# --------------------------------------------------------------------------
# The default: English constructions read by regular expressions
# --------------------------------------------------------------------------
# A capitalised token (a name or a title: "Marlow", "Dr", "O'Brien"), and runs of them.
_CAP = r"[A-Z][A-Za-z0-9-]*(?:['’][A-Z][A-Za-z0-9-]*)?"
_NAME = rf"{_CAP}(?:\s+{_CAP})*"
# A value: a run of capitalised words and numbers ("Oven Lane", "B12", "1854", "Dr Osei"), after at most
# two lower-case modifiers ("blue Fiat"), or failing that one to three lower-case words that end the
# clause ("teal", "dark blue").
_PROPER_VALUE = r"(?:[A-Z0-9][\w.:-]*)(?:\s+(?:[A-Z0-9][\w.:-]*|de|da|del|la|le|van|von))*"
_PLAIN_VALUE = r"[a-z][a-z-]*(?:\s+[a-z][a-z-]*){0,2}(?=\s*(?:[.,;:!]|$))"
_FILLERS = r"(?:(?:now|still|actually|definitely|officially|really|just|also|probably|always)\s+)*"
_ARTICLE = r"(?:(?:a|an|the)\s+)?"
_VALUE = rf"{_FILLERS}{_ARTICLE}(?P<value>(?:[a-z][a-z-]*\s+){{0,2}}{_PROPER_VALUE}|{_PLAIN_VALUE})"
_ATTRIBUTE = r"(?P<attribute>[a-z][a-z-]*(?:\s+[a-z][a-z-]*){0,3}?)"
_COPULA = r"(?:is|was|has\s+been|remains|became|becomes)"
_POSSESSIVE = r"['’]s"
_PRONOUN = r"(?:his|her|their)"

# (pattern, whether the value comes first).  Each names its groups entity, attribute and value.
_PATTERNS = (
    # "Marlow's home city is Lisbon", "So Marlow's car is now a Fiat"
    (re.compile(rf"\b(?P<entity>{_NAME}){_POSSESSIVE}\s+{_ATTRIBUTE}\s+{_COPULA}\s+{_VALUE}"), False),
    # "Marlow's gym: Pulse"
    (re.compile(rf"\b(?P<entity>{_NAME}){_POSSESSIVE}\s+{_ATTRIBUTE}\s*:\s*{_VALUE}"), False),
    # "The dentist of Marlow is Dr Osei"
    (re.compile(rf"\b[Tt]he\s+{_ATTRIBUTE}\s+of\s+(?P<entity>{_NAME})\s+{_COPULA}\s+{_VALUE}"), False),
    # "Marlow said their gym is Pulse", "Marlow told me that her car is a Fiat"
    (re.compile(rf"\b(?P<entity>{_NAME})\s+(?:said|says|mentioned|mentions|told\s+\w+|confirmed|confirms|reported|"
                rf"reports|wrote|writes|announced|announces)\s+(?:that\s+)?{_PRONOUN}\s+{_ATTRIBUTE}\s+{_COPULA}\s+"
                rf"{_VALUE}"), False),
    # "Marlow changed their gym to Pulse", "Marlow has moved her locker number to 1854"
    (re.compile(rf"\b(?P<entity>{_NAME})\s+(?:has\s+)?(?:changed|changes|switched|switches|moved|moves|updated|"
                rf"updates|set|sets)\s+{_PRONOUN}\s+{_ATTRIBUTE}\s+to\s+{_VALUE}"), False),
    # "Marlow has a new car: a Fiat", "Marlow got a new dentist, Dr Osei"
    (re.compile(rf"\b(?P<entity>{_NAME})\s+(?:now\s+)?(?:has|had|got|gets|found|picked)\s+a\s+new\s+{_ATTRIBUTE}"
                rf"\s*[:,—–-]\s*{_VALUE}"), False),
    # "Lisbon is Marlow's home city now"
    (re.compile(rf"\b(?P<value>{_PROPER_VALUE})\s+(?:is|was)\s+(?:now\s+)?(?P<entity>{_NAME}){_POSSESSIVE}\s+"
                rf"(?P<attribute>[a-z][a-z-]*(?:\s+[a-z][a-z-]*){{0,3}}?)(?=\s*(?:[.,;:!]|$|\s+(?:now|these\s+"
                rf"days|again|lately|too)\b))"), True),
)

# Sentence-initial words that are not part of a name ("So Marlow's car ..." is Marlow's car): closed
# classes of English (pronouns, conjunctions, sentence adverbs, interjections, question and auxiliary
# words).
_NOT_NAMES = {
    "a", "about", "actually", "after", "ah", "also", "an", "and", "anyway", "apparently", "as", "at", "before", "btw",
    "but", "by", "can", "could", "did", "do", "does", "for", "fyi", "guess", "has", "have", "he", "her", "hey", "his",
    "hmm", "how", "however", "i", "if", "in", "indeed", "is", "it", "its", "just", "last", "maybe", "meanwhile", "my",
    "next", "no", "note", "now", "oh", "ok", "okay", "on", "once", "our", "please", "plus", "ps", "remember",
    "remind", "right", "she", "since", "so", "somebody", "someone", "still", "sure", "tell", "the", "their", "then",
    "there", "they", "this", "today", "turns", "um", "update", "was", "we", "well", "what", "when", "where", "which",
    "who", "why", "will", "with", "would", "yeah", "yes", "yesterday", "you", "your",
}
# Words that make a clause something other than a plain assertion of the present state: negation,
# modality, conditions, doubt.  A fact is dropped when one of them precedes it in its sentence.
_NOT_ASSERTED = {
    "not", "never", "no", "nobody", "nothing", "neither", "nor", "doubt", "doubts", "if", "unless", "whether",
    "might", "may", "could", "would", "should", "maybe", "perhaps", "wonder", "wonders", "suppose", "imagine",
    "wish", "hope", "hopes", "unsure", "unlikely", "rumour", "rumor", "supposedly", "allegedly", "longer",
}
_NEGATED_CONTRACTION = re.compile(r"n['’]t\b", re.IGNORECASE)
_SENTENCE = re.compile(r"[^.!?]+(?:[.!?]+|$)")
_TOKEN = re.compile(r"[A-Za-z]+(?:['’][A-Za-z]+)?")
_TRAILING_FILLERS = re.compile(r"(?:\s+(?:now|these\s+days|again|lately|too|anymore|as\s+well))+$")
_CAP_RUN = re.compile(rf"{_NAME}")


def _strip_leading(name: str) -> str:
    """Drop sentence-initial function words from a capitalised run ("So Marlow" -> "Marlow")."""
    words = name.split()
    while words and words[0].lower() in _NOT_NAMES:
        words.pop(0)
    return " ".join(words)


def _asserted(prefix: str) -> bool:
    """Whether the words before (and of) a match leave it a plain assertion."""
    if _NEGATED_CONTRACTION.search(prefix):
        return False
    # Lower-case words and the sentence's first: "May" and "Will" inside a sentence are names.
    words = _TOKEN.findall(prefix)
    return not any(w.lower() in _NOT_ASSERTED for i, w in enumerate(words) if w.islower() or i == 0)


class PatternExtractor:
    """The default extractor: a few English constructions, read with regular expressions (no model).

    Reads, in each declarative sentence (a sentence ending in "?" is a
    question and states nothing):

    * possessive copula -- "Marlow's home city is Lisbon", "So Marlow's car is
      now a Fiat", "Marlow's gym: Pulse", "Lisbon is Marlow's home city now";
    * "the <attribute> of <Name> is <value>";
    * reported speech with a possessive pronoun -- "Marlow said their gym is
      Pulse", "Marlow told me that her dentist is Dr Osei";
    * change of state -- "Marlow changed their locker number to 1854",
      "Marlow has a new car: a Fiat".

    Entities are capitalised names (sentence-initial function words such as
    "So" or "Remember" are dropped from a name); the attribute is one to four
    lower-case words; the value a run of capitalised words and numbers, or up
    to three lower-case words ending the clause, after an optional article and
    adverb ("now", "still", "definitely").  A fact is not extracted when a
    negation, modal or condition precedes it in its sentence ("not", "n't",
    "never", "no longer", "if", "might", "may", "would", "maybe", "doubt" ...):
    those sentences do not assert the current value.  Pronoun subjects ("She
    changed her car ...") are not resolved, and constructions outside the list
    ("As for Marlow, the car is a Fiat") are not read; a model-based extractor
    is the way to cover them.  ``mentions(text)`` returns the capitalised
    runs of a text, without their sentence-initial function words.
    """

    name = "patterns"

    def extract(self, text: str) -> list[Fact]:
        if not isinstance(text, str):
            raise ValueError(f"text must be a string, got {type(text).__name__}")
        facts: list[Fact] = []
        seen: set[tuple[str, str]] = set()
        for sentence_match in _SENTENCE.finditer(text):
            sentence = sentence_match.group(0).strip()
            if not sentence or sentence.endswith("?"):
                continue
            spans: list[tuple[int, int]] = []
            for pattern, value_first in _PATTERNS:
                for m in pattern.finditer(sentence):
                    if any(m.start() < end and start < m.end() for start, end in spans):
                        continue  # an earlier construction already read this stretch
                    entity = _strip_leading(m.group("entity"))
                    attribute = _TRAILING_FILLERS.sub("", m.group("attribute")).strip()
                    value = _TRAILING_FILLERS.sub("", m.group("value")).strip(" .,;:")
                    if value_first:  # "So Lisbon is ..." names Lisbon
                        value = _strip_leading(value)
                    if not entity or not attribute or not value or not _asserted(sentence[: m.end()]):
                        continue
                    fact = Fact(entity, attribute, value)
                    if fact.key in seen:
                        continue
                    seen.add(fact.key)
                    spans.append((m.start(), m.end()))
                    facts.append(fact)
        return facts

    def mentions(self, text: str) -> list[str]:
        if not isinstance(text, str):
            raise ValueError(f"text must be a string, got {type(text).__name__}")
        names = []
        for m in _CAP_RUN.finditer(text):
            name = _strip_leading(re.sub(r"['’]s$", "", m.group(0)))
            if name and name not in names:
                names.append(name)
        return names


class ModelExtractor:
    """Facts read by a user's language model: ``generate(prompt) -> str`` (nothing is downloaded).

    The prompt asks for one ``entity | attribute | value`` line per fact the
    turn asserts, or ``none``; lines that do not split into three non-empty
    fields are ignored (a model's chatter around its answer costs nothing).
    ``mentions`` is the pattern extractor's (capitalised names): a model call
    per question would sit on the recall's latency path.  A GLiNER or
    relation-extraction pipeline plugs in the same way, as any object with
    ``extract`` and ``mentions`` (:class:`FactExtractor`).

    >>> extractor = ModelExtractor(lambda prompt: my_llm(prompt, max_new_tokens=64))
    """

    name = "model"

    def __init__(self, generate: Callable[[str], str], *,
                 prompt: str = "List the facts this line of a conversation states about a named person or thing, "
                               "one per line as: entity | attribute | value. Questions, negations and guesses state "
                               "nothing; answer none if there is no fact.\nLine: {text}\nFacts:"):
        if not callable(generate):
            raise ValueError(f"generate must be callable(prompt) -> str, got {type(generate).__name__}")
        if "{text}" not in prompt:
            raise ValueError("prompt must contain {text}")
        self.generate = generate
        self.prompt = prompt
        self._names = PatternExtractor()

    def extract(self, text: str) -> list[Fact]:
        if not isinstance(text, str):
            raise ValueError(f"text must be a string, got {type(text).__name__}")
        out = self.generate(self.prompt.format(text=text))
        if not isinstance(out, str):
            raise ValueError(f"generate(prompt) must return a string, got {type(out).__name__}")
        facts, seen = [], set()
        for line in out.splitlines():
            fields = [f.strip(" -*\t") for f in line.split("|")]
            if len(fields) == 3 and all(fields):
                fact = Fact(*fields)
                if fact.key not in seen:
                    seen.add(fact.key)
                    facts.append(fact)
        return facts

    def mentions(self, text: str) -> list[str]:
        return self._names.mentions(text)
