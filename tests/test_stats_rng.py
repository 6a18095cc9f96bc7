import math

import jax.numpy as jnp
import numpy as np
import pytest

from hbfjax import rng
from hbfjax.stats import mean_ci95, t975


def test_t_quantiles_match_tables():
    assert t975(1) == pytest.approx(12.706)
    assert t975(30) == pytest.approx(2.042, abs=1e-3)
    assert t975(120) == pytest.approx(1.980, abs=1e-3)


def test_ci95_of_a_known_sample():
    mean, ci = mean_ci95([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and ci == pytest.approx(3.182 * math.sqrt(5 / 3) / 2, rel=1e-4)


def _chi2_bound(df: int) -> float:
    # chi-square with df degrees of freedom ≈ Normal(df, 2 df); 5 sigma: false-alarm rate ~ 3e-7
    return df + 5.0 * math.sqrt(2 * df)


def test_uniform_index_is_uniform_over_planes():
    n_bins, draws = 3072, 3072 * 400
    h = rng.mix(7, jnp.arange(draws, dtype=jnp.int32))
    counts = np.bincount(np.asarray(rng.uniform_index(h, n_bins)), minlength=n_bins)
    expected = draws / n_bins
    chi2 = np.sum((counts - expected) ** 2 / expected)
    assert chi2 < _chi2_bound(n_bins - 1)
    assert counts.min() > 0


def test_neighbouring_streams_and_pages_are_independent():
    # joint distribution of (plane of page i, plane of page i+1) and of the same page in streams s, s+1
    bins, n = 32, 200_000
    idx = jnp.arange(n, dtype=jnp.int32)
    a = np.asarray(rng.uniform_index(rng.mix(1, 5, idx), bins))
    b = np.asarray(rng.uniform_index(rng.mix(1, 5, idx + 1), bins))
    c = np.asarray(rng.uniform_index(rng.mix(1, 6, idx), bins))
    for x, y in ((a, b), (a, c)):
        joint = np.bincount(x * bins + y, minlength=bins * bins)
        expected = n / bins**2
        assert np.sum((joint - expected) ** 2 / expected) < _chi2_bound(bins * bins - 1)


def test_hash_words_are_order_sensitive():
    assert int(rng.mix(1, 2)) != int(rng.mix(2, 1))


def test_every_hash_salt_is_named_once_with_a_distinct_value():
    import ast
    import pathlib

    from hbfjax.salts import Salt

    values = [s.value for s in Salt]
    assert len(values) == len(set(values))  # @unique enforces it at import; this pins it
    # no mechanism passes a bare number or a SALT_* constant as a salt any more: every salt is a Salt member
    root = pathlib.Path(__file__).resolve().parents[1] / "hbfjax"
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "mix":
                for arg in node.args:
                    literal = isinstance(arg, ast.Constant) and isinstance(arg.value, int)
                    assert not literal, f"{path.name}:{node.lineno}: inline numeric salt {arg.value}"
                    assert not (isinstance(arg, ast.Name) and arg.id.startswith("SALT")), f"{path.name}:{node.lineno}"


def test_32_bit_draw_below_n_is_the_exact_multiply_high():
    gen = np.random.default_rng(1)
    edges = np.array([[0, 2**32 - 1], [2**32 - 1, 1], [2**32 - 1, 2**32 - 1]], np.uint64)
    h = np.concatenate([gen.integers(0, 2**32, 100_000, dtype=np.uint64), edges[:, 0]])
    n = np.concatenate([gen.integers(1, 2**32, 100_000, dtype=np.uint64), edges[:, 1]])
    got = np.asarray(rng.below(jnp.asarray(h, jnp.uint32), jnp.asarray(n, jnp.uint32))).astype(np.uint64)
    np.testing.assert_array_equal(got, (h * n) >> np.uint64(32))
