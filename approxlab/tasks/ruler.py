r"""RULER-style retrieval sequences built offline: needles of random keys and values in a haystack of filler text.

RULER (Hsieh et al., 2024) tests what a long context holds by hiding facts ("needles") in filler text (the
"haystack") and asking for them at the end. Six of its tasks are built here from random keys and values drawn
from a ``generator`` (:func:`ruler_sequence`), in either of two haystacks (:data:`HAYSTACKS`): a window of the
shipped WikiText-2 (the stand-in for RULER's essays) or RULER's "noise", one line of plain sentences repeated
(:data:`NOISE`, :func:`noise_haystack`; RULER's haystack for its single-needle pass-key task ``niah_single_1`` and
for variable tracking):

* ``"single-needle"`` (RULER's NIAH single): one needle "One of the special magic numbers for {key} is: {value}."
  at ``depth``; asked for its value.
* ``"single-needle-uuid"`` (RULER's ``niah_single_3``): the same with a random UUID for its value ("One of the
  special magic uuids for {key} is: {value}."), 36 characters to copy where the pass key has 7 digits.
* ``"multi-key"`` (NIAH multi-key): the needle and :data:`DISTRACTORS` others with different keys (distractor
  needles) at random depths; asked for the first key's value.
* ``"multi-value"`` (NIAH multi-value): :data:`VALUES` needles of one key with different values, the first at
  ``depth``; asked for all of them, in order of appearance.
* ``"multi-query"`` (NIAH multi-query): :data:`VALUES` needles of different keys; asked for the values of all of
  them, in order of appearance.
* ``"variable-tracking"`` (RULER's VT): a chain "VAR X1 = {value}.", "VAR X2 = X1.", ... of :data:`HOPS`
  assignments spread over the text, the first at ``depth``; asked which variables hold the value.

A sequence is a preamble, the haystack with the needles, the question, then the answer (a space and its
text). The question and the answer are tokenized together, and the answer's tokens are those from where the
answer's first character begins (a token of whitespace alone before it ends the question, as SmolLM2's tokenizer
writes " 4" as " ", "4"). A model answers when greedy decoding after the question gives every answer token
(exact match; :attr:`approxlab.patching.Continuation.correct`); the answer tokens' summed log-probability is the
graded score (:meth:`~approxlab.patching.Continuation.answer_logprob`).

Left out of RULER: NIAH with word values, the essay haystack (Paul Graham's essays do not ship; WikiText-2
stands in) and the haystack of needles (its ``niah_multikey_2``), the "common/frequent words extraction"
aggregation tasks and question answering (SQuAD/HotpotQA: no offline copy). A needle goes in at a token position
in either haystack (RULER puts one between two of its noise lines), so it may cut a noise sentence.

Public API::

    RULER_TASKS, HAYSTACKS, NOISE
    ruler_sequence(task, tokenizer, filler, *, length, depth, generator) -> NeedleSequence
    noise_haystack(tokenizer, tokens) -> torch.Tensor   # RULER's repeated noise, as filler
    NeedleSequence    # ids, question_start, answer_length, answer, keys, depths

References
----------
.. [1] C.-P. Hsieh et al., "RULER: What's the real context size of your long-context language models?",
   COLM 2024 (arXiv:2404.06654); templates from its ``scripts/data/synthetic/constants.py``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import torch

from .._validation import as_generator, check_choice, check_int

__all__ = ["RULER_TASKS", "HAYSTACKS", "NOISE", "DISTRACTORS", "VALUES", "HOPS", "KEYS", "NeedleSequence",
           "ruler_sequence", "noise_haystack"]

RULER_TASKS = ("single-needle", "multi-key", "multi-value", "multi-query", "variable-tracking", "single-needle-uuid")
"""The tasks :func:`ruler_sequence` builds."""

HAYSTACKS = ("wikitext", "noise")
"""The haystacks a sequence's needles are hidden in: ``"wikitext"``, a window of WikiText-2 (a different text for
each window); ``"noise"``, :data:`NOISE` repeated (:func:`noise_haystack`: the same filler in every sequence, which
then differ only in their draws of keys, values and the other needles' depths)."""

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"
"""RULER's noise haystack: this line repeated (its ``niah_single_1`` and variable-tracking tasks)."""

DISTRACTORS = 3
"""Needles of other keys beside the asked one in ``"multi-key"`` (RULER's ``num_needle_k = 4`` in all)."""

VALUES = 4
"""Needles in ``"multi-value"`` (values of one key) and ``"multi-query"`` (keys asked for): RULER's 4."""

HOPS = 4
"""Assignments in the variable-tracking chain (RULER's ``num_hops = 4``, one chain)."""

KEYS = ("apple", "river", "candle", "falcon", "harbor", "meadow", "orbit", "pepper", "quartz", "saddle",
        "tunnel", "violet", "walnut", "anchor", "blossom", "canyon", "dolphin", "ember", "glacier", "hammer",
        "island", "jasmine", "kettle", "lantern", "marble", "nectar", "oyster", "pebble", "quiver", "ribbon",
        "spindle", "thistle", "umbrella", "velvet", "willow", "yarrow", "zephyr", "basket", "copper", "dagger")
"""Words the keys are drawn from (distinct within a sequence)."""

PREAMBLE = {
    "needle": ("Some special magic numbers are hidden within the following text. Make sure to memorize it. I will "
               "quiz you about the numbers afterwards.\n"),
    "variable-tracking": ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n"),
}
PREAMBLE["single-needle-uuid"] = PREAMBLE["needle"].replace("numbers", "uuids")
NEEDLE = " One of the special magic numbers for {key} is: {value}."
UUID_NEEDLE = NEEDLE.replace("numbers", "uuids")
QUESTIONS = {
    "single-needle": "\nWhat is the special magic number for {key} mentioned in the provided text? The special "
                     "magic number for {key} mentioned in the provided text is",
    "multi-value": "\nWhat are all the special magic numbers for {key} mentioned in the provided text? The special "
                   "magic numbers for {key} mentioned in the provided text are",
    "multi-query": "\nWhat are all the special magic numbers for {keys} mentioned in the provided text? The special "
                   "magic numbers for {keys} mentioned in the provided text are",
    "variable-tracking": "\nQuestion: Find all variables that are assigned the value {value} in the text above. "
                         "Answer: According to the chain(s) of variable assignment in the text above, {count} "
                         "variables are assigned the value {value}, they are:",
}
QUESTIONS["multi-key"] = QUESTIONS["single-needle"]
QUESTIONS["single-needle-uuid"] = QUESTIONS["single-needle"].replace("number", "uuid")


@dataclass(frozen=True)
class NeedleSequence:
    """One RULER-style sequence (:func:`ruler_sequence`).

    Attributes
    ----------
    task : str
    ids : torch.Tensor
        ``(1, length)`` token ids: preamble, haystack with needles, question, answer.
    question_start : int
        The question's first position: the context is ``ids[:, :question_start]``.
    answer_length : int
        The answer's tokens, the last ``answer_length`` of ``ids``.
    answer : str
        The answer's text (without its leading space).
    keys : tuple of str
        The needles' keys (variable names for variable tracking), the asked ones first.
    depths : tuple of float
        Where each needle went, as a fraction of the haystack before it, in order of appearance.

    Examples
    --------
    Built by hand (:func:`ruler_sequence` builds it from a tokenizer): 10 tokens, the question from position 6,
    the answer the last 2.

    >>> import torch
    >>> from approxlab.tasks.ruler import NeedleSequence
    >>> found = NeedleSequence("single-needle", torch.arange(10).unsqueeze(0), question_start=6, answer_length=2,
    ...                        answer="4217", keys=("apple",), depths=(0.5,))
    >>> found.ids[:, :found.question_start].shape, found.continuation   # the context, then what follows it
    (torch.Size([1, 6]), tensor([[6, 7, 8, 9]]))
    >>> found.continuation[:, -found.answer_length:]                  # the answer's tokens
    tensor([[8, 9]])
    """

    task: str
    ids: torch.Tensor
    question_start: int
    answer_length: int
    answer: str
    keys: tuple
    depths: tuple

    @property
    def continuation(self) -> torch.Tensor:
        """``(1, t)``: the question and the answer, what follows the context."""
        return self.ids[:, self.question_start:]


def _encode(tokenizer, text: str) -> torch.Tensor:
    return torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)


def _question_and_answer(tokenizer, question: str, answer: str) -> tuple[torch.Tensor, int]:
    """``(ids, answer tokens)`` of ``question + " " + answer`` tokenized at once; the answer's tokens start at the
    first token that holds a character of ``answer`` (a whitespace-only token before it stays with the question)."""
    ids = _encode(tokenizer, f"{question} {answer}")
    asked = len(_encode(tokenizer, question))
    if asked >= len(ids) or not torch.equal(ids[:asked], _encode(tokenizer, question)):
        ids = torch.cat([_encode(tokenizer, question), _encode(tokenizer, f" {answer}")])
    start = min(asked, len(ids) - 1)
    while start < len(ids) - 1 and not tokenizer.decode(ids[start:start + 1]).strip():
        start += 1
    return ids, len(ids) - start


def _needles(task: str, depth: float, generator: torch.Generator) -> tuple:
    """``(needle texts with their depths, question, answer, keys)`` of one sequence, drawn from ``generator``."""
    order = torch.randperm(len(KEYS), generator=generator).tolist()
    count = {"single-needle": 1, "single-needle-uuid": 1, "multi-key": 1 + DISTRACTORS, "multi-value": 1,
             "multi-query": VALUES, "variable-tracking": HOPS}[task]
    values = [int(v) for v in torch.randint(1_000_000, 10_000_000, (max(count, VALUES),), generator=generator)]
    others = torch.rand(max(count, VALUES), generator=generator).tolist()  # the depths of all needles but the first
    if task == "variable-tracking":
        names = [f"X{n}" for n in torch.randperm(90, generator=generator)[:HOPS].add(10).tolist()]
        texts = [f" VAR {names[0]} = {values[0]}."] + [f" VAR {names[i]} = {names[i - 1]}." for i in range(1, HOPS)]
        depths = sorted(others[:HOPS - 1])
        depths = [depth] + [depth + (1 - depth) * d for d in depths]  # the chain's order is the text's
        question = QUESTIONS[task].format(value=values[0], count=HOPS)
        return list(zip(texts, depths)), question, " ".join(names), tuple(names)
    keys = [KEYS[i] for i in order[:count]]
    if task == "single-needle-uuid":  # RULER's value: uuid.UUID(int=<128 random bits>, version=4)
        bits = int.from_bytes(bytes(torch.randint(0, 256, (16,), generator=generator).tolist()), "big")
        value = str(uuid.UUID(int=bits, version=4))
        needle = UUID_NEEDLE.format(key=keys[0], value=value)
        return [(needle, depth)], QUESTIONS[task].format(key=keys[0]), value, (keys[0],)
    if task == "multi-value":
        texts = [NEEDLE.format(key=keys[0], value=value) for value in values[:VALUES]]
        depths = [depth] + others[:VALUES - 1]
        shown = [value for _, value in sorted(zip(depths, values[:VALUES]))]
        return list(zip(texts, depths)), QUESTIONS[task].format(key=keys[0]), ", ".join(map(str, shown)), (keys[0],)
    texts = [NEEDLE.format(key=key, value=value) for key, value in zip(keys, values)]
    depths = [depth] + others[:count - 1]
    if task == "multi-query":
        shown = [(d, key, value) for d, key, value in sorted(zip(depths, keys, values))]
        question = QUESTIONS[task].format(keys=", ".join(key for _, key, _ in shown))
        return (list(zip(texts, depths)), question, ", ".join(str(value) for *_, value in shown),
                tuple(key for _, key, _ in shown))
    return list(zip(texts, depths)), QUESTIONS[task].format(key=keys[0]), str(values[0]), tuple(keys)


def ruler_sequence(task: str, tokenizer, filler: torch.Tensor, *, length: int, depth: float,
                   generator: torch.Generator | None = None) -> NeedleSequence:
    r"""A RULER-style sequence of exactly ``length`` tokens (the module docstring describes the tasks).

    Parameters
    ----------
    task : str
        One of :data:`RULER_TASKS`.
    tokenizer : transformers.PreTrainedTokenizerBase
        The model's tokenizer.
    filler : torch.Tensor
        ``(m,)`` token ids of the haystack (e.g. a WikiText-2 window, :func:`approxlab.data.windows`), at least as
        many as the room left by the preamble, needles, question and answer; its first tokens are used.
    length : int
        Tokens of the whole sequence.
    depth : float
        Where the first (asked) needle goes: the fraction of the haystack before it, in ``[0, 1]``.
    generator : torch.Generator, optional
        The keys, values and the other needles' depths (uniform in ``[0, 1]``) are drawn from it.

    Returns
    -------
    NeedleSequence

    Raises
    ------
    ValueError
        ``task`` not in :data:`RULER_TASKS`; ``depth`` outside ``[0, 1]``; ``length`` too short for the fixed
        text, or a ``filler`` too short for the room left.

    Examples
    --------
    >>> import torch
    >>> from approxlab.data import load_model, wikitext_token_ids, windows
    >>> from approxlab.tasks.ruler import ruler_sequence
    >>> tokenizer = load_model("pretrained", checkpoint="HuggingFaceTB/SmolLM2-135M-Instruct").tokenizer
    >>> filler = windows(wikitext_token_ids(tokenizer), 512)[0]
    >>> found = ruler_sequence("multi-key", tokenizer, filler, length=512, depth=0.5,
    ...                        generator=torch.Generator().manual_seed(0))
    >>> found.ids.shape, len(found.keys), found.answer.isdigit()
    (torch.Size([1, 512]), 4, True)
    """
    task = check_choice(task, "task", RULER_TASKS)
    length = check_int(length, "length", low=2)
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"`depth` must be a fraction of the haystack in [0, 1]; got {depth!r}.")
    generator = as_generator(generator)
    needles, question, answer, keys = _needles(task, depth, generator)
    preamble = _encode(tokenizer, PREAMBLE.get(task, PREAMBLE["needle"]))
    asked, answer_length = _question_and_answer(tokenizer, question, answer)
    needles = sorted(needles, key=lambda needle: needle[1])
    encoded = [_encode(tokenizer, text) for text, _ in needles]
    room = length - len(preamble) - len(asked) - sum(len(e) for e in encoded)
    if room < 1 or filler.numel() < room:
        raise ValueError(f"`length` must leave room for the haystack ({length - room} tokens of preamble, needles, "
                         f"question and answer for task {task!r}); got length={length} with {filler.numel()} filler "
                         "tokens.")
    parts, last = [preamble], 0
    for (_, where), ids in zip(needles, encoded):
        cut = max(last, int(round(where * room)))
        parts.extend([filler[last:cut], ids])
        last = cut
    parts.extend([filler[last:room], asked])
    ids = torch.cat(parts).unsqueeze(0)
    return NeedleSequence(task, ids, length - len(asked), answer_length, answer, keys,
                          tuple(where for _, where in needles))


def noise_haystack(tokenizer, tokens: int) -> torch.Tensor:
    """``(tokens,)`` token ids of RULER's noise haystack: :data:`NOISE` repeated, tokenized as one text, its first
    ``tokens`` ids (a ``filler`` for :func:`ruler_sequence`, which cuts it where the room ends, as it cuts a
    WikiText-2 window).

    Examples
    --------
    >>> from approxlab.data import load_model
    >>> from approxlab.tasks.ruler import noise_haystack
    >>> tokenizer = load_model("pretrained", checkpoint="HuggingFaceTB/SmolLM2-135M-Instruct").tokenizer
    >>> filler = noise_haystack(tokenizer, 64)
    >>> filler.shape, tokenizer.decode(filler[:10])
    (torch.Size([64]), 'The grass is green. The sky is blue.')
    """
    tokens = check_int(tokens, "tokens", low=1)
    line = len(_encode(tokenizer, NOISE))
    ids = _encode(tokenizer, NOISE * (tokens // max(1, line) + 2))
    return ids[:tokens]
