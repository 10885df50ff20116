"""approxlab.tasks.ruler: RULER-style needle sequences, checked with a character-level tokenizer.

Each task's sequence has the requested length, holds its needles at the declared depths in the order of the
text, asks its question and ends with the answer, whose tokens are the last ``answer_length``; the answer is
what the needles say (multi-value and multi-query in order of appearance, variable tracking the chain's names, the
UUID task a version-4 UUID);
the same generator gives the same sequence.
"""

from __future__ import annotations

import re
import uuid

import pytest
import torch

from approxlab.tasks.ruler import DISTRACTORS, HOPS, NOISE, RULER_TASKS, VALUES, noise_haystack, ruler_sequence


class Characters:
    """A tokenizer with one token per character (``ord``)."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids):
        return "".join(chr(int(i)) for i in ids)


TOKENIZER = Characters()
FILLER = torch.tensor([ord(c) for c in ("lorem ipsum dolor sit amet " * 200)])


def build(task, seed=0, depth=0.5, length=3000):
    return ruler_sequence(task, TOKENIZER, FILLER, length=length, depth=depth, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("task", RULER_TASKS)
def test_a_sequence_holds_its_needles_question_and_answer(task):
    found = build(task)
    text = TOKENIZER.decode(found.ids[0])
    assert found.ids.shape == (1, 3000) and found.task == task
    assert TOKENIZER.decode(found.ids[0, -found.answer_length:]) == found.answer  # the space ends the question
    continuation = TOKENIZER.decode(found.continuation[0])
    assert continuation.startswith("\n") and continuation.endswith(" " + found.answer)
    haystack = text[:found.question_start]
    if task == "variable-tracking":
        value = re.search(r"VAR (X\d+) = (\d+)\.", haystack)
        chain = [value.group(1)]
        for _ in range(HOPS - 1):
            chain.append(re.search(rf"VAR (X\d+) = {chain[-1]}\.", haystack).group(1))
        assert found.answer == " ".join(chain) == " ".join(found.keys) and value.group(2) in continuation
        assert [haystack.index(f"VAR {name} ") for name in chain] == sorted(haystack.index(f"VAR {name} ")
                                                                          for name in chain)
        return
    if task == "single-needle-uuid":  # RULER's niah_single_3: a version-4 UUID for its value
        needles = re.findall(r"magic uuids for (\w+) is: ([0-9a-f-]{36})\.", haystack)
        assert needles == [(found.keys[0], found.answer)] and found.depths == (0.5,)
        assert str(uuid.UUID(found.answer)) == found.answer and uuid.UUID(found.answer).version == 4
        assert f"uuid for {found.keys[0]} mentioned" in continuation and "magic numbers" not in text
        assert text.startswith("Some special magic uuids are hidden")
        return
    needles = re.findall(r"magic numbers for (\w+) is: (\d+)\.", haystack)
    expected = {"single-needle": 1, "multi-key": 1 + DISTRACTORS, "multi-value": VALUES, "multi-query": VALUES}
    assert len(needles) == expected[task] and len(found.depths) == expected[task]
    assert list(found.depths) == sorted(found.depths) and 0.5 in found.depths
    if task in ("single-needle", "multi-key"):
        assert found.answer == dict(needles)[found.keys[0]] and f"number for {found.keys[0]} mentioned" in continuation
        assert len({key for key, _ in needles}) == len(needles)  # distractors: other keys
    elif task == "multi-value":
        assert {key for key, _ in needles} == {found.keys[0]}
        assert found.answer == ", ".join(value for _, value in needles)  # in order of appearance
    else:
        assert found.answer == ", ".join(value for _, value in needles)
        assert ", ".join(key for key, _ in needles) in continuation and list(found.keys) == [k for k, _ in needles]


def test_the_asked_needle_goes_at_its_depth():
    for depth in (0.0, 0.25, 1.0):
        found = build("single-needle", depth=depth)
        text = TOKENIZER.decode(found.ids[0])
        start = len("Some special magic numbers are hidden within the following text. Make sure to memorize it. I "
                    "will quiz you about the numbers afterwards.\n")
        room = found.question_start - start - len(" One of the special magic numbers for x is: 1234567.") \
            - len(found.keys[0]) + 1
        assert text.index(" One of the special") - start == round(depth * room)


@pytest.mark.parametrize("task", ["multi-query", "single-needle-uuid"])
def test_the_generator_decides_the_keys_and_values(task):
    first, again, other = build(task, seed=3), build(task, seed=3), build(task, seed=4)
    assert torch.equal(first.ids, again.ids) and first.answer == again.answer
    assert first.answer != other.answer


@pytest.mark.parametrize("kwargs, match", [
    (dict(task="needle"), r"`task` must be one of \['multi-key', 'multi-query', 'multi-value', 'single-needle', "
                          r"'single-needle-uuid', 'variable-tracking'\]; got 'needle'"),
    (dict(depth=1.5), r"`depth` must be a fraction of the haystack in \[0, 1\]; got 1.5"),
    (dict(length=100), r"`length` must leave room for the haystack \(\d+ tokens of preamble, needles, question and "
                       r"answer for task 'single-needle'\); got length=100"),
])
def test_inputs_are_checked(kwargs, match):
    arguments = {"task": "single-needle", "depth": 0.5, "length": 3000, **kwargs}
    with pytest.raises(ValueError, match=match):
        ruler_sequence(arguments["task"], TOKENIZER, FILLER, length=arguments["length"], depth=arguments["depth"])


def test_the_noise_haystack_is_rulers_line_repeated_and_cut_at_the_length_asked():
    filler = noise_haystack(TOKENIZER, 1000)
    assert filler.shape == (1000,)
    text = TOKENIZER.decode(filler)
    assert text == (NOISE * (1000 // len(NOISE) + 1))[:1000] and text.startswith("The grass is green.")
    found = ruler_sequence("single-needle", TOKENIZER, noise_haystack(TOKENIZER, 3000), length=3000, depth=0.5,
                           generator=torch.Generator().manual_seed(0))
    assert found.ids.shape == (1, 3000) and "There and back again." in TOKENIZER.decode(found.ids[0])
    with pytest.raises(ValueError, match=r"`tokens` must be .*1.*; got 0"):
        noise_haystack(TOKENIZER, 0)
