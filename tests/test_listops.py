"""ListOps generator and evaluator (LRA's task, regenerated: approxlab.tasks.listops)."""

import pytest
import torch

from approxlab import tasks
from approxlab.tasks import listops


def _g(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize(
    "text, value",
    [
        ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
        ("[MIN 3 [MAX 8 1 ] 5 ]", 3),
        ("[SM 7 8 9 ]", 4),  # 24 mod 10
        ("[MED 1 9 4 ]", 4),
        ("[MED 1 2 ]", 1),  # LRA: int(np.median([1, 2])) = int(1.5) = 1
        ("[MED 3 8 9 2 ]", 5),  # median of 2 3 8 9 = 5.5 -> 5
        ("7", 7),
    ],
)
def test_evaluate_hand_examples(text, value):
    """The evaluator applies LRA's MAX / MIN / MED / SUM_MOD semantics."""
    assert listops.evaluate(text.split()) == value


@pytest.mark.parametrize("seed", range(20))
def test_generated_label_is_value_and_length_bounded(seed):
    """Evaluating a generated expression (stack parser) gives its label (tree recursion), and
    every expression respects the length window."""
    examples = listops.generate_expressions(5, min_length=20, max_length=120, generator=_g(seed))
    for tokens, label in examples:
        assert 20 <= len(tokens) <= 120
        assert 0 <= label <= 9
        assert listops.evaluate(tokens) == label
        ids = listops.encode(tokens, 128)
        assert listops.evaluate(ids.tolist()) == label  # ids and padding work too


def test_lra_lengths_default():
    """LRA's window: 500 <= length <= 2000 tokens."""
    examples = listops.generate_expressions(3, generator=_g(0))
    assert all(500 <= len(t) <= 2000 for t, _ in examples)


def test_seeded_reproducibility():
    """The same generator state gives the same expressions; another seed gives others."""
    a = listops.generate_expressions(4, min_length=10, max_length=200, generator=_g(3))
    b = listops.generate_expressions(4, min_length=10, max_length=200, generator=_g(3))
    c = listops.generate_expressions(4, min_length=10, max_length=200, generator=_g(4))
    assert a == b
    assert a != c


def test_global_rng_untouched():
    state = torch.random.get_rng_state()
    listops.generate_expressions(2, min_length=10, max_length=100, generator=_g(0))
    assert torch.equal(state, torch.random.get_rng_state())


def test_batches_shapes_padding_and_task_registry():
    task = tasks.make_task("listops", n=64, batch_size=3, num_batches=2, generator=_g(1))
    assert task.kind == "classification" and task.num_classes == 10 and task.vocab_size == len(listops.VOCABULARY)
    for batch in task.batches:
        assert batch.input_ids.shape == (3, 64) and batch.labels.shape == (3,)
        assert torch.equal(batch.mask, batch.input_ids != listops.PAD_ID)
        assert (batch.mask.sum(-1) >= 16).all()  # min_length = n // 4
        for ids, label in zip(batch.input_ids, batch.labels):
            assert listops.evaluate(ids.tolist()) == int(label)
    assert "listops" in tasks.available()


def test_validation_messages():
    with pytest.raises(ValueError, match="min_length"):
        listops.generate_expressions(1, min_length=50, max_length=10)
    with pytest.raises(ValueError, match="max_args"):
        listops.generate_expressions(1, max_args=1)
    with pytest.raises(ValueError, match="at most `length`=3"):
        listops.encode(["[MAX", "1", "2", "]"], 3)
    with pytest.raises(ValueError, match="malformed"):
        listops.evaluate(["[MAX", "1", "2"])
    with pytest.raises(ValueError, match="exactly one expression"):
        listops.evaluate(["1", "2"])
    with pytest.raises(ValueError, match="ListOps tokens"):
        listops.evaluate(["[FOO", "1", "]"])
    with pytest.raises(RuntimeError, match="widen the window"):
        listops.generate_expressions(1, min_length=3, max_length=3, max_depth=0, max_tries=50, generator=_g(0))
    with pytest.raises(ValueError, match="`name` must be one of"):
        tasks.make_task("cifar10", n=8, batch_size=1, num_batches=1)


def _nesting(ids):
    depth = deepest = 0
    for token in (listops.VOCABULARY[i] for i in ids.tolist()):
        depth += token.startswith("[") - (token == "]")
        deepest = max(deepest, depth)
    return deepest


def test_task_max_depth_bounds_the_nesting():
    """``make_task(max_depth=4)``: no expression nests deeper than 4 brackets; LRA's depth 10 does."""
    shallow = tasks.make_task("listops", n=256, batch_size=16, num_batches=1, max_depth=4, generator=_g(2))
    deep = tasks.make_task("listops", n=256, batch_size=16, num_batches=1, generator=_g(2))
    assert max(_nesting(ids) for ids in shallow.batches[0].input_ids) <= 4 == shallow.info["max_depth"]
    assert max(_nesting(ids) for ids in deep.batches[0].input_ids) > 4 and deep.info["max_depth"] == 10
    for ids, label in zip(shallow.batches[0].input_ids, shallow.batches[0].labels):
        assert listops.evaluate(ids.tolist()) == int(label)
