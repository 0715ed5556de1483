"""The seeded Gumbel-max sampler draws from the temperature / top-p distribution (no model needed)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from transforms.llm.transformers_backend import _SeededSampler  # noqa: E402

PROBS = torch.tensor([0.5, 0.3, 0.2])


def _frequencies(temperature, top_p, rows=4000):
    sampler = _SeededSampler(temperature, top_p, list(range(rows)), "cpu")
    scores = PROBS.log().expand(rows, 3).clone()
    picks = sampler(None, scores).argmax(dim=-1)
    return torch.bincount(picks, minlength=3).float() / rows


def test_samples_follow_the_distribution():
    assert torch.allclose(_frequencies(1.0, 1.0), PROBS, atol=0.03)


def test_top_p_keeps_the_smallest_nucleus():
    assert torch.allclose(_frequencies(1.0, 0.6), torch.tensor([0.625, 0.375, 0.0]), atol=0.03)
    assert torch.allclose(_frequencies(1.0, 0.4), torch.tensor([1.0, 0.0, 0.0]))


def test_temperature_sharpens():
    expected = PROBS ** 2 / (PROBS ** 2).sum()  # T = 0.5 squares the probabilities
    assert torch.allclose(_frequencies(0.5, 1.0), expected, atol=0.03)


def test_rows_are_seeded_independently():
    scores = torch.zeros(2, 50)
    a = _SeededSampler(1.0, 1.0, [7, 8], "cpu")(None, scores.clone())
    b = _SeededSampler(1.0, 1.0, [7], "cpu")(None, scores[:1].clone())
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], a[1])
