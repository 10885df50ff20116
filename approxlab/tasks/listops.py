r"""ListOps: nested MAX / MIN / MED / SUM_MOD expressions over the digits 0-9 (LRA).

A ListOps expression is a tree whose leaves are digits and whose inner nodes apply one of
four list operators to their children; the label is the expression's value, one of 10
classes. This module regenerates the Long Range Arena (LRA) variant of the task
(Tay et al., 2020, after Nangia and Bowman, 2018) offline, from a seeded generator, so the
instability study (Skyformer Appendix F, Table 3) needs no downloaded data.

Tokens, as in LRA's files with the brackets-only tokenisation::

    [MAX 2 9 [MIN 4 7 ] 0 ]      ->  value 9

Generation follows LRA's ``listops.py``: a node at depth ``< max_depth`` is a leaf with
probability ``0.75`` (``VALUE_P = 0.25`` is the probability of an operator), an operator
node draws ``randint(2, max_args)`` children and one of the four operators uniformly; an
expression is kept only if its token count lies in ``[min_length, max_length]`` (LRA:
``max_depth=10, max_args=10, min_length=500, max_length=2000``).

References
----------
Nangia, N. and Bowman, S. R. (2018). ListOps: A diagnostic dataset for latent tree
learning. NAACL Student Research Workshop.

Tay, Y. et al. (2020). Long Range Arena: A benchmark for efficient transformers.
ICLR 2021 (``lra_benchmarks/data/listops.py``).

Chen, Y., Zeng, Q., Ji, H. and Yang, Y. (2021). Skyformer. NeurIPS. Section 5 (ListOps
among the five LRA tasks) and Appendix F (Table 3).
"""

from __future__ import annotations

import numpy as np
import torch

from .._validation import as_generator, check_int
from ._base import Batch, Task

__all__ = [
    "OPERATORS",
    "VOCABULARY",
    "PAD_ID",
    "NUM_CLASSES",
    "generate_tree",
    "tree_tokens",
    "tree_value",
    "evaluate",
    "generate_expressions",
    "encode",
    "listops_batches",
    "make_task",
]

MIN, MAX, MED, SUM_MOD, END = "[MIN", "[MAX", "[MED", "[SM", "]"
OPERATORS = (MIN, MAX, MED, SUM_MOD)
DIGITS = tuple(str(d) for d in range(10))
PAD = "<pad>"
#: Token strings; the id of a token is its index. ``PAD_ID = 0``.
VOCABULARY = (PAD, *DIGITS, *OPERATORS, END)
PAD_ID = 0
NUM_CLASSES = 10
VALUE_P = 0.25  # probability that a node above max_depth is an operator (LRA's VALUE_P)
_TOKEN_ID = {token: i for i, token in enumerate(VOCABULARY)}


def _apply(operator: str, values: list[int]) -> int:
    """Value of ``operator`` applied to the list ``values`` (LRA's semantics)."""
    if operator == MAX:
        return max(values)
    if operator == MIN:
        return min(values)
    if operator == SUM_MOD:
        return sum(values) % 10
    # MED: LRA computes int(np.median(values)); for an even count that floors the mean
    # of the two middle values (all values are >= 0).
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) // 2


class _TooLong(Exception):
    """Internal: the tree being drawn already exceeds the length budget."""


def generate_tree(rng: np.random.Generator, *, max_depth: int = 10, max_args: int = 10, max_length=None):
    """Draw one expression tree (LRA's ``generate_tree``).

    Parameters
    ----------
    rng : numpy.random.Generator
        A local generator (see :func:`generate_expressions` for how it is derived from a
        ``torch.Generator``).
    max_depth, max_args : int
        Nodes at depth ``max_depth`` are leaves; an operator has ``2..max_args`` children.
    max_length : int or None
        Stop drawing (return None) as soon as the tree has more tokens than this; the
        caller rejects such trees anyway, so the distribution of kept trees is unchanged.

    Returns
    -------
    tree : int or tuple or None
        A digit, or ``(operator, [children])``; None when ``max_length`` was exceeded.

    Examples
    --------
    >>> import numpy as np
    >>> from approxlab.tasks.listops import generate_tree, tree_tokens, tree_value
    >>> tree = generate_tree(np.random.default_rng(3), max_depth=2, max_args=3)
    >>> tree
    ('[MIN', [8, ('[MAX', [4, 6, 4])])
    >>> " ".join(tree_tokens(tree)), tree_value(tree)
    ('[MIN 8 [MAX 4 6 4 ] ]', 6)
    >>> generate_tree(np.random.default_rng(3), max_depth=2, max_args=3, max_length=4) is None  # too long
    True
    """
    budget = [float("inf") if max_length is None else int(max_length)]

    def draw(depth):
        if depth < max_depth and rng.random() <= VALUE_P:
            budget[0] -= 2  # operator token and END
            if budget[0] < 0:
                raise _TooLong
            num_children = int(rng.integers(2, max_args + 1))
            operator = OPERATORS[int(rng.integers(len(OPERATORS)))]
            return operator, [draw(depth + 1) for _ in range(num_children)]
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooLong
        return int(rng.integers(10))

    try:
        return draw(0)
    except _TooLong:
        return None


def tree_tokens(tree) -> list[str]:
    """Tokens of a tree in prefix order: ``(MAX, [2, 9]) -> ["[MAX", "2", "9", "]"]``.

    Examples
    --------
    >>> from approxlab.tasks.listops import tree_tokens
    >>> tree_tokens(("[MAX", [2, 9, ("[MIN", [4, 7]), 0]))
    ['[MAX', '2', '9', '[MIN', '4', '7', ']', '0', ']']
    """
    out: list[str] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            out.append(node)
        elif isinstance(node, tuple):
            operator, children = node
            out.append(operator)
            stack.append(END)
            stack.extend(reversed(children))
        else:
            out.append(str(node))
    return out


def tree_value(tree) -> int:
    """Value of a tree, computed recursively on the tree (not on its tokens).

    Examples
    --------
    >>> from approxlab.tasks.listops import tree_value
    >>> tree_value(("[MAX", [2, 9, ("[MIN", [4, 7]), 0]))
    9
    >>> tree_value(("[SM", [8, 5]))  # the sum modulo 10
    3
    """
    if isinstance(tree, tuple):
        operator, children = tree
        return _apply(operator, [tree_value(child) for child in children])
    return int(tree)


def evaluate(tokens) -> int:
    """Evaluate a token sequence with a stack (independent of how it was generated).

    Parameters
    ----------
    tokens : sequence of str or of int
        Token strings (``"[MAX"``, ``"3"``, ``"]"``) or token ids from :func:`encode`;
        padding (``PAD_ID`` / ``"<pad>"``) is ignored.

    Returns
    -------
    int
        The value of the expression, in ``0..9``.

    Raises
    ------
    ValueError
        If the sequence is not one well-formed expression.

    Examples
    --------
    >>> from approxlab.tasks.listops import encode, evaluate
    >>> tokens = "[MAX 2 9 [MIN 4 7 ] 0 ]".split()
    >>> evaluate(tokens)
    9
    >>> evaluate(encode(tokens, 12))  # token ids with padding give the same value
    9
    """
    stack: list[list] = []
    result = None
    for token in tokens:
        if not isinstance(token, str):
            token = VOCABULARY[int(token)]
        if token == PAD:
            continue
        if result is not None:
            raise ValueError(f"`tokens` must hold exactly one expression; got trailing token {token!r}.")
        if token in OPERATORS:
            stack.append([token])
        elif token == END:
            if not stack or len(stack[-1]) < 2:
                raise ValueError("`tokens` is malformed: ']' without an open operator with arguments.")
            operator, *values = stack.pop()
            value = _apply(operator, values)
            if stack:
                stack[-1].append(value)
            else:
                result = value
        elif token in DIGITS:
            if stack:
                stack[-1].append(int(token))
            else:
                result = int(token)
        else:
            raise ValueError(f"`tokens` must contain only ListOps tokens {list(VOCABULARY)}; got {token!r}.")
    if result is None:
        raise ValueError("`tokens` is malformed: the expression is empty or not closed.")
    return result


def generate_expressions(
    num_examples: int,
    *,
    min_length: int = 500,
    max_length: int = 2000,
    max_depth: int = 10,
    max_args: int = 10,
    generator: torch.Generator | None = None,
    max_tries: int = 1_000_000,
) -> list[tuple[list[str], int]]:
    """Draw ListOps expressions whose token count lies in ``[min_length, max_length]``.

    Parameters
    ----------
    num_examples : int
        How many expressions, ``>= 1``.
    min_length, max_length : int
        Token-count bounds (LRA: 500 and 2000), ``1 <= min_length <= max_length``.
    max_depth, max_args : int
        Tree shape (LRA: 10 and 10); ``max_args >= 2``.
    generator : torch.Generator, optional
        Source of all randomness: one 62-bit draw from it seeds a local
        ``numpy.random.Generator`` that draws the trees (fast scalar draws). The same
        generator state gives the same expressions.
    max_tries : int
        Cap on rejected trees before giving up.

    Returns
    -------
    list of (tokens, label)
        ``tokens`` a list of token strings, ``label = evaluate(tokens)`` in ``0..9``.

    Raises
    ------
    RuntimeError
        If ``max_tries`` trees are rejected (the length window is too narrow for the shape).

    Examples
    --------
    >>> import torch
    >>> from approxlab.tasks.listops import evaluate, generate_expressions
    >>> examples = generate_expressions(3, min_length=5, max_length=20, generator=torch.Generator().manual_seed(0))
    >>> [5 <= len(tokens) <= 20 for tokens, _ in examples]
    [True, True, True]
    >>> all(evaluate(tokens) == label for tokens, label in examples)
    True
    """
    num_examples = check_int(num_examples, "num_examples", low=1)
    max_length = check_int(max_length, "max_length", low=1)
    min_length = check_int(min_length, "min_length", low=1, high=max_length)
    max_depth = check_int(max_depth, "max_depth", low=0)
    max_args = check_int(max_args, "max_args", low=2)
    max_tries = check_int(max_tries, "max_tries", low=1)
    g = as_generator(generator)

    rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=g)))
    examples = []
    tries = 0
    while len(examples) < num_examples:
        tries += 1
        if tries > max_tries:
            raise RuntimeError(
                f"ListOps generation rejected {max_tries} trees: no tree with {min_length} <= length <= "
                f"{max_length} tokens at max_depth={max_depth}, max_args={max_args}; widen the window."
            )
        tree = generate_tree(rng, max_depth=max_depth, max_args=max_args, max_length=max_length)
        if tree is None:
            continue
        tokens = tree_tokens(tree)
        if len(tokens) < min_length:
            continue
        examples.append((tokens, tree_value(tree)))
    return examples


def encode(tokens, length: int) -> torch.Tensor:
    """Token ids ``(length,)`` (``int64``), right-padded with ``PAD_ID``.

    Raises
    ------
    ValueError
        If the expression has more than ``length`` tokens.

    Examples
    --------
    >>> from approxlab.tasks.listops import VOCABULARY, encode
    >>> ids = encode(["[MAX", "2", "9", "]"], 6)
    >>> ids
    tensor([12,  3, 10, 15,  0,  0])
    >>> [VOCABULARY[i] for i in ids]
    ['[MAX', '2', '9', ']', '<pad>', '<pad>']
    """
    length = check_int(length, "length", low=1)
    if len(tokens) > length:
        raise ValueError(f"`tokens` must have at most `length`={length} tokens; got {len(tokens)}.")
    ids = torch.full((length,), PAD_ID, dtype=torch.int64)
    ids[: len(tokens)] = torch.tensor([_TOKEN_ID[t] for t in tokens], dtype=torch.int64)
    return ids


def listops_batches(
    num_batches: int,
    batch_size: int,
    n: int,
    *,
    min_length: int | None = None,
    max_depth: int = 10,
    max_args: int = 10,
    generator: torch.Generator | None = None,
) -> list[Batch]:
    """Batches of ListOps expressions padded to ``n`` tokens.

    Parameters
    ----------
    num_batches, batch_size : int
        ``>= 1``.
    n : int
        Sequence length: expressions have at most ``n`` tokens and are padded to ``n``
        (LRA: 2000).
    min_length : int, optional
        Shortest expression kept; default ``n // 4`` (LRA's 500 for ``n = 2000``).
    max_depth, max_args : int
        Tree shape (LRA: 10, 10).
    generator : torch.Generator, optional
        Source of all randomness.

    Returns
    -------
    list of approxlab.tasks.Batch
        ``input_ids (batch_size, n)``, ``mask`` (True on real tokens), ``labels (batch_size,)``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.tasks.listops import listops_batches
    >>> batches = listops_batches(2, 4, 32, generator=torch.Generator().manual_seed(0))
    >>> len(batches), batches[0].input_ids.shape, batches[0].labels.shape
    (2, torch.Size([4, 32]), torch.Size([4]))
    >>> bool((batches[0].mask.sum(-1) >= 32 // 4).all())  # at least n // 4 real tokens
    True
    """
    num_batches = check_int(num_batches, "num_batches", low=1)
    batch_size = check_int(batch_size, "batch_size", low=1)
    n = check_int(n, "n", low=1)
    min_length = max(1, n // 4) if min_length is None else check_int(min_length, "min_length", low=1, high=n)
    examples = generate_expressions(
        num_batches * batch_size,
        min_length=min_length,
        max_length=n,
        max_depth=max_depth,
        max_args=max_args,
        generator=generator,
    )
    batches = []
    for b in range(num_batches):
        chunk = examples[b * batch_size : (b + 1) * batch_size]
        ids = torch.stack([encode(tokens, n) for tokens, _ in chunk])
        labels = torch.tensor([label for _, label in chunk], dtype=torch.int64)
        batches.append(Batch(ids, ids != PAD_ID, labels))
    return batches


def make_task(*, n: int, batch_size: int, num_batches: int, generator=None, data_dir=None,
              max_depth: int = 10) -> Task:
    """The ListOps task for the instability study (Skyformer Appendix F, Table 3).

    Parameters
    ----------
    n : int
        Padded length (LRA: 2000); expressions have ``n // 4 .. n`` tokens.
    batch_size, num_batches : int
    generator : torch.Generator, optional
        Source of all randomness.
    data_dir : ignored
        ListOps is generated, not read (accepted so every task factory has one signature).
    max_depth : int
        Depth of the expression trees (LRA: 10; :func:`generate_tree`).

    Returns
    -------
    approxlab.tasks.Task
        ``kind="classification"``, ``num_classes=10``, ``vocab_size=len(VOCABULARY)``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.tasks.listops import make_task
    >>> task = make_task(n=32, batch_size=4, num_batches=2, generator=torch.Generator().manual_seed(0))
    >>> task.kind, task.num_classes, task.vocab_size, len(task.batches)
    ('classification', 10, 16, 2)
    """
    batches = listops_batches(num_batches, batch_size, n, max_depth=max_depth, generator=generator)
    lengths = [int(b.mask.sum(-1).min()) for b in batches] + [int(b.mask.sum(-1).max()) for b in batches]
    return Task(
        name="listops",
        kind="classification",
        vocab_size=len(VOCABULARY),
        num_classes=NUM_CLASSES,
        n=n,
        batches=batches,
        info={"min_tokens": min(lengths), "max_tokens": max(lengths), "max_depth": max_depth, "max_args": 10},
    )
