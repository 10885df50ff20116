r"""The long-context retrieval target: a pass key hidden in WikiText-2 and asked for at the end.

A sequence of ``length`` tokens is :data:`PREAMBLE`, a WikiText-2 window with one sentence, :data:`NEEDLE` (a
five-digit key drawn from the cell's seed), inserted at a fraction ``depth`` of the text, then :data:`QUESTION`
and the key itself (:func:`passkey_sequence`). A model retrieves the key when, teacher-forced, each of the key's
tokens is its most likely next token (``correct``); ``answer_logprob`` is the key tokens' summed log-probability
(nats). The key's tokens are those of the key's characters in the question and key tokenized together; a token
of whitespace alone before them (SmolLM2's tokenizer writes " 40076" as " ", "4", "0", "0", "7", "6") ends the
question and is not scored: it is the question's wording, not the retrieval. Built offline, from the corpus the
study already reads (the "pass key" task of Mohtashami and Jaggi, 2023, with a WikiText filler in place of their
repeated sentence).

Measured with SmolLM2-135M-Instruct (the packaged GGUF, unpatched; every digit of the key greedy-correct) on the
study's sequences (3 windows x depths 25% and 75%): 6 of 6 at 1,024 tokens and 6 of 6 at 2,048. Scored with the
space before the key, the model missed 5 of the 6 at 2,048 tokens, each on that space alone (every digit right).
"""

from __future__ import annotations

import torch

__all__ = ["PREAMBLE", "NEEDLE", "QUESTION", "question_and_key", "passkey_sequence", "answer_scores"]

NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
"""The sentence hidden in the text (a leading space: it continues a sentence of the filler)."""

PREAMBLE = ("There is an important piece of information hidden inside a lot of irrelevant text. Find it and memorize "
            "it. I will quiz you about it.\n")
"""What the sequence opens with (Mohtashami and Jaggi's template announces the key the same way)."""

QUESTION = "\nWhat is the pass key? The pass key is"
"""What is asked at the end; the key follows (a space, then its digits), its tokens scored."""


def _ids(tokenizer, text: str) -> torch.Tensor:
    return torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)


def question_and_key(tokenizer, key: int) -> tuple:
    """``(question, answer)`` token ids: :data:`QUESTION` and ``" {key}"`` tokenized together, split where the key's
    first token begins (a token of whitespace alone before it stays with the question). A tokenizer whose
    tokens cross that boundary gets the two tokenized apart.
    """
    question = _ids(tokenizer, QUESTION)
    asked = _ids(tokenizer, f"{QUESTION} {key}")
    if len(asked) <= len(question) or not torch.equal(asked[:len(question)], question):
        return question, _ids(tokenizer, f" {key}")  # the tokenizer merges across the boundary: tokenize apart
    split = len(question)
    while split < len(asked) - 1 and not tokenizer.decode(asked[split:split + 1]).strip():
        split += 1
    return asked[:split], asked[split:]


def passkey_sequence(tokenizer, filler: torch.Tensor, *, length: int, depth: float, key: int) -> tuple:
    """``(ids (1, length), answer (first, stop), question start)``: ``filler`` cut to fit, the needle at ``depth``,
    the question, the key; the key's tokens at positions ``first:stop`` (:func:`question_and_key`), the question's
    first token at ``question start``.

    Parameters
    ----------
    tokenizer : transformers.PreTrainedTokenizerBase
        The model's tokenizer.
    filler : torch.Tensor
        ``(t,)`` WikiText-2 token ids, ``t >= length``.
    length : int
        Tokens of the whole sequence.
    depth : float
        Where the needle goes, in ``[0, 1]``: the fraction of the filler before it.
    key : int
        The pass key, five digits.
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"`depth` must be in [0, 1]; got {depth!r}.")
    preamble, needle = _ids(tokenizer, PREAMBLE), _ids(tokenizer, NEEDLE.format(key=key))
    question, answer = question_and_key(tokenizer, key)
    fixed = len(preamble) + len(needle) + len(question) + len(answer)
    room = length - fixed
    if room < 1 or filler.numel() < room:
        raise ValueError(f"`length` must leave room for the filler ({fixed} tokens of preamble, needle, question and "
                         f"key); got {length} with {filler.numel()} filler tokens.")
    cut = int(round(depth * room))
    ids = torch.cat([preamble, filler[:cut], needle, filler[cut:room], question, answer])
    return ids.unsqueeze(0), (length - len(answer), length), length - len(answer) - len(question)


def answer_scores(nll: torch.Tensor, hits: torch.Tensor, answer: tuple) -> dict:
    """``answer_logprob`` (the key tokens' summed log-probability, teacher-forced) and ``correct`` (1.0 when every
    key token is the model's most likely next token, else 0.0), from :func:`approxlab.patching.token_nll`'s
    ``(1, length - 1)`` ``nll`` and ``hits``."""
    first, stop = answer
    return {"answer_logprob": -float(nll[0, first - 1:stop - 1].sum()),
            "correct": float(bool(hits[0, first - 1:stop - 1].all()))}
