"""bfloat16 on a CPU (jaxgpt/model/products.py): the projections' products on operands rounded
to bfloat16, accumulated in float32, forward and backward, in the forms XLA hands to its bfloat16
library; everything else in float32; flax's own bfloat16 elsewhere (a TPU traced on this
machine, a CPU without bfloat16 units)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgpt.config import ModelConfig
from jaxgpt.model import products
from jaxgpt.model.layers import dtypes, projection_keywords

BF16 = jnp.bfloat16


def rounded(a) -> np.ndarray:
    """a's values as bfloat16 holds them, in float64."""
    return np.asarray(jnp.asarray(a, BF16).astype(jnp.float32), np.float64)


# (lhs shape, rhs shape, dimension numbers): a Dense, DenseGeneral's fused q/k/v (features over
# three axes), the output projection (three axes contracted) and the tied head (x @ E.T)
CASES = {
    "dense": ((2, 5, 24), (24, 40), (((2,), (0,)), ((), ()))),
    "qkv": ((2, 5, 24), (24, 2, 5, 8), (((2,), (0,)), ((), ()))),
    "out": ((2, 5, 2, 3, 8), (2, 3, 8, 24), (((2, 3, 4), (0, 1, 2)), ((), ()))),
    "tied_head": ((2, 5, 24), (50, 24), (((2,), (1,)), ((), ()))),
}


def reference(x, w, dimension_numbers) -> np.ndarray:
    (lc, rc), _ = dimension_numbers
    return np.tensordot(x, w, axes=(lc, rc))


@pytest.mark.parametrize("case", CASES)
def test_product_and_its_gradients_are_float64_on_bfloat16_operands(case):
    """Forward: the float64 product of the operands rounded to bfloat16. Backward: the same for
    g @ w.T and x.T @ g, g rounded too. The only other error is float32 accumulation: at most
    K (<= 48 terms here) x 2^-24 of the sum of the terms' sizes, so 1e-5 of |x| @ |w| bounds it
    with room, while a product that skipped the rounding of the operands (2^-9 relative each)
    would miss by ~1e-3."""
    x_shape, w_shape, dn = CASES[case]
    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], x_shape)
    w = jax.random.normal(keys[1], w_shape)
    y, pullback = jax.vjp(lambda x, w: products.dot_general(x, w, dn), x, w)
    g = jax.random.normal(keys[2], y.shape)
    dx, dw = pullback(g)
    xr, wr, gr = rounded(x), rounded(w), rounded(g)
    (lc, rc), _ = dn
    free_x = [a for a in range(x.ndim) if a not in lc]
    free_w = [a for a in range(w.ndim) if a not in rc]
    # the backward products by their definition: y's axes are x's free ones, then w's
    want_dx = np.tensordot(gr, wr, axes=(list(range(len(free_x), y.ndim)), free_w))
    want_dx = np.moveaxis(want_dx, list(range(want_dx.ndim)), free_x + list(lc))
    want_dw = np.tensordot(xr, gr, axes=(free_x, list(range(len(free_x)))))
    want_dw = np.moveaxis(want_dw, list(range(want_dw.ndim)), list(rc) + free_w)
    for got, want, scale in (
        (y, reference(xr, wr, dn), reference(np.abs(xr), np.abs(wr), dn)),
        (dx, want_dx, None),
        (dw, want_dw, None),
    ):
        assert got.dtype == jnp.float32 and got.shape == want.shape
        scale = np.abs(want).max() if scale is None else scale
        np.testing.assert_array_less(np.abs(np.asarray(got, np.float64) - want), 1e-5 * scale + 1e-30)
    assert np.abs(np.asarray(y, np.float64) - reference(np.asarray(x), np.asarray(w), dn)).max() > 1e-4  # rounded


def test_other_products_are_lax_dot_general_unchanged():
    """A batched product and a bfloat16 one are not the projections': lax.dot_general's bits."""
    a = jax.random.normal(jax.random.key(1), (3, 4, 8))
    b = jax.random.normal(jax.random.key(2), (3, 8, 5))
    batched = (((2,), (1,)), ((0,), (0,)))
    np.testing.assert_array_equal(products.dot_general(a, b, batched), jax.lax.dot_general(a, b, batched))
    plain = (((2,), (0,)), ((), ()))
    half = products.dot_general(a.astype(BF16), b[0].astype(BF16), plain)
    np.testing.assert_array_equal(half, jax.lax.dot_general(a.astype(BF16), b[0].astype(BF16), plain))


def bf16_operand_products(hlo: str) -> int:
    """How many of a compiled CPU program's library fusions take two bfloat16 operands and return
    float32: the products that run on the bfloat16 units."""
    pattern = r"\(param_0(\.\d+)?: bf16\[[^\]]*\], param_1(\.\d+)?: bf16\[[^\]]*\]\) -> f32\["
    library = {m.group(1) for m in re.finditer(r"calls=(%[\w.\-]+), .*__ynn_fusion", hlo)}
    headers = [line for line in hlo.splitlines() if re.search(pattern, line)]
    return sum(any(line.lstrip().startswith(name + " ") for name in library) for line in headers)


def test_a_dense_layers_three_products_reach_the_bfloat16_library():
    """The point of the module: XLA:CPU takes all three products of a layer's forward and backward
    pass as bfloat16 x bfloat16 -> float32 library calls, none converted to float32 first (it
    converts flax's own bfloat16 product, and x.T @ g written plainly)."""
    x = jnp.ones((64, 48))
    w = jnp.ones((48, 32))
    dn = (((1,), (0,)), ((), ()))

    def loss(x, w, product):
        return jnp.sum(jnp.tanh(product(x, w, dn)))

    ours = jax.jit(jax.grad(lambda x, w: loss(x, w, products.dot_general), (0, 1))).lower(x, w).compile().as_text()
    assert bf16_operand_products(ours) == 3

    def plain(x, w, dn):  # what flax writes under bfloat16 compute
        return jax.lax.dot_general(x.astype(BF16), w.astype(BF16), dn).astype(jnp.float32)

    theirs = jax.jit(jax.grad(lambda x, w: loss(x, w, plain), (0, 1))).lower(x, w).compile().as_text()
    assert bf16_operand_products(theirs) == 0


def bf16_config(**kw) -> ModelConfig:
    return ModelConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, d_model=32, dtype="bfloat16", **kw)


def test_the_path_is_taken_on_a_cpu_with_bfloat16_units_alone(monkeypatch):
    config = bf16_config()
    monkeypatch.setattr(products, "cpu_has_bfloat16_units", lambda: True)
    assert dtypes(config)["dtype"] == jnp.float32 and projection_keywords(config)["dot_general"] is products.dot_general
    assert dtypes(config.replace(dtype="float32"))["dtype"] == jnp.float32
    assert "dot_general" not in projection_keywords(config.replace(dtype="float32"))  # float32 runs: unchanged
    with products.traced_for("tpu"):  # a TPU's program compiled here computes as a TPU does
        assert dtypes(config)["dtype"] == BF16 and "dot_general" not in projection_keywords(config)
    monkeypatch.setattr(products, "cpu_has_bfloat16_units", lambda: False)
    assert dtypes(config)["dtype"] == BF16 and "dot_general" not in projection_keywords(config)


def test_cpu_has_bfloat16_units_reads_the_flags(monkeypatch, tmp_path):
    def with_flags(flags: str) -> bool:
        info = tmp_path / "cpuinfo"
        info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
        monkeypatch.setattr(products, "CPUINFO", info)
        products.bfloat16_units.cache_clear()
        return products.cpu_has_bfloat16_units()

    try:
        assert with_flags("fpu avx2 avx512f avx512_bf16")  # Zen 4, Cooper Lake
        assert with_flags("fpu avx512f amx_bf16 amx_tile")  # Sapphire Rapids and later
        assert not with_flags("fpu sse2 avx2 fma")  # Zen 3
        monkeypatch.setattr(products, "CPUINFO", tmp_path / "absent")
        products.bfloat16_units.cache_clear()
        assert not products.cpu_has_bfloat16_units()  # not Linux
    finally:
        products.bfloat16_units.cache_clear()


@pytest.mark.parametrize(
    "settings",
    [dict(tie_embeddings=True), dict(tie_embeddings=False), dict(scan_layers=True, remat="full"),
     dict(lora_rank=4, lora_targets="qkv,out,up,down")],
    ids=["tied", "untied", "scanned-remat", "lora"],
)  # fmt: skip
def test_a_models_loss_and_gradients_follow_float32(monkeypatch, settings):
    """A bfloat16 model on a CPU with the units against the float32 model, same parameters: only
    the products' operands are rounded (2^-9 relative each), so the loss moves by well under 1%
    and the gradient by a few percent at most; the difference is not zero (bfloat16 was used)."""
    from conftest import cross_entropy

    from jaxgpt.model.transformer import GPT

    monkeypatch.setattr(products, "cpu_has_bfloat16_units", lambda: True)
    config = bf16_config(**settings)
    tokens = jax.random.randint(jax.random.key(3), (4, 17), 0, config.vocab_size)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
    params = GPT(config.replace(dtype="float32")).init(jax.random.key(0), batch["inputs"])["params"]

    def loss_and_grads(c):
        return jax.value_and_grad(lambda p: cross_entropy(GPT(c), p, batch))(params)

    (full, g_full), (half, g_half) = loss_and_grads(config.replace(dtype="float32")), loss_and_grads(config)
    assert 0 < abs(float(half) - float(full)) < 1e-2 * float(full)
    flat_full, flat_half = (jnp.concatenate([a.ravel() for a in jax.tree.leaves(g)]) for g in (g_full, g_half))
    assert float(jnp.linalg.norm(flat_half - flat_full) / jnp.linalg.norm(flat_full)) < 0.03
