"""Low-rank adapters (jaxgpt/model/lora.py): an adapter starts as the base model, merges into
weights that compute what the adapted model computes, and fine-tuning through the engine changes
the adapters alone."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import small_run_config

from jaxgpt.config import ModelConfig
from jaxgpt.config_files import resolve
from jaxgpt.errors import UserError
from jaxgpt.job.trainer import train_and_evaluate
from jaxgpt.model.lora import is_adapter, merge
from jaxgpt.model.transformer import GPT, init_params

BASE = ModelConfig(vocab_size=64, n_layer=2, n_head=4, n_kv_head=2, d_model=32, block_size=16, position="rope")


def randomised_adapters(params, seed: int = 1):
    """`params` with every adapter matrix drawn afresh (B too, which starts at 0), so merging has
    something to fold in."""
    keys = iter(jax.random.split(jax.random.key(seed), 1000))
    return jax.tree_util.tree_map_with_path(
        lambda path, p: 0.3 * jax.random.normal(next(keys), p.shape) if is_adapter(path) else p, params
    )


def without_adapters(params):
    if not isinstance(params, dict):
        return params
    return {k: without_adapters(v) for k, v in params.items() if k not in ("lora_a", "lora_b")}


@pytest.mark.parametrize(
    "changes",
    [
        {},
        pytest.param({"activation": "swiglu", "scan_layers": True}, id="swiglu-scanned", marks=pytest.mark.slow),
        pytest.param({"lora_targets": "qkv,down"}, id="two-targets", marks=pytest.mark.slow),
    ],
)
def test_merged_adapters_compute_what_the_adapted_model_computes(changes):
    """Random adapters of rank 4 beside the chosen projections (SwiGLU's fused gate-and-up,
    scanned layers' stacked ones): the merged model's logits equal the adapted model's, up to
    float32 summation order (W + s A B summed before the product rather than after: 1e-4 of
    logits of size ~1). With B at 0, as initialised, the adapted model is the base, exactly.
    Quick: the default targets, 16 s (Zen 4, beside a training job); the other two slow, 13 s each."""
    config = BASE.replace(lora_rank=4, lora_alpha=8.0, **changes)
    params = init_params(config, jax.random.key(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 16)), jnp.int32)
    base_config, base_params = merge(config, params)
    start = GPT(config).apply({"params": params}, tokens)
    np.testing.assert_array_equal(start, GPT(base_config).apply({"params": without_adapters(params)}, tokens))
    adapted = randomised_adapters(params)
    merged_config, merged = merge(config, adapted)
    assert merged_config.lora_rank == 0 and jax.tree.structure(merged) == jax.tree.structure(base_params)
    want = GPT(config).apply({"params": adapted}, tokens)
    got = GPT(merged_config).apply({"params": merged}, tokens)
    assert float(jnp.abs(want - start).max()) > 0.1  # the adapters change the logits: there is something to merge
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_an_adapter_config_names_projections_the_model_has():
    with pytest.raises(UserError, match="lora_targets.*names mlp"):
        BASE.replace(lora_rank=4, lora_targets="qkv,mlp")
    with pytest.raises(UserError, match="mixture of experts has no adapters"):
        BASE.replace(lora_rank=4, moe={"experts": 4, "top_k": 2})
    with pytest.raises(UserError, match="lora_rank.*must be >= 0"):
        BASE.replace(lora_rank=-1)
    # above the stream's width the product A·B cannot have the rank asked for (it trained silently)
    assert BASE.replace(lora_rank=BASE.d_model).lora_rank == BASE.d_model
    with pytest.raises(UserError, match=f"lora_rank={BASE.d_model + 1} is above d_model={BASE.d_model}"):
        BASE.replace(lora_rank=BASE.d_model + 1)


def test_fine_tuning_with_adapters_changes_the_adapters_alone(trained_small_run, tmp_path):
    """The shared base run, then 4 steps with adapters from it: every base weight is the base
    run's, bit for bit, each adapter B has moved from 0; Adam's moments exist for the adapters
    alone (the optimizer state is 2 x the adapters' size, not 2 x the model's)."""
    from jaxgpt.job.checkpoint import load_latest

    tuned = small_run_config(steps=4, eval_every=4, checkpoint_every=4, eval_batches=1)
    tuned.model.update(lora_rank=2)
    tuned.train.init_from = str(trained_small_run)
    train_and_evaluate(tuned, tmp_path / "tuned", progress=False)
    _, base_params, _, _ = load_latest(trained_small_run)
    run, params, _, _ = load_latest(tmp_path / "tuned")
    assert run.model.lora_rank == 2
    jax.tree.map(np.testing.assert_array_equal, without_adapters(params), base_params)
    adapters = [p for path, p in jax.tree_util.tree_leaves_with_path(params) if is_adapter(path)]
    assert adapters and all(float(jnp.abs(b).max()) > 0 for b in adapters)
    from jaxgpt.training.program import training_program

    opt_state = jax.eval_shape(training_program(run).optimizer.init, params)
    state_numbers = sum(x.size for x in jax.tree.leaves(opt_state) if x.ndim > 0)  # not the step counts
    assert state_numbers == 2 * sum(a.size for a in adapters)


@pytest.mark.slow
def test_an_adapted_run_exports_merged_weights_that_compute_its_logits(tmp_path):
    """jaxgpt export of a run with adapters writes an ordinary GPT-2 folder; read back by the
    Hugging Face loader, its logits are the adapted run's (1e-4: the merge's summation order).
    Slow: 10 s, a training run and an export."""
    from jaxgpt.commands import export
    from jaxgpt.hf import load_pretrained
    from jaxgpt.job.checkpoint import load_latest

    config = small_run_config(steps=3, eval_every=3, checkpoint_every=3, eval_batches=1, lr=3e-2)
    config.model.update(lora_rank=2)
    train_and_evaluate(config, tmp_path / "run", progress=False)
    export.main(["--workdir", str(tmp_path / "run"), "--out", str(tmp_path / "hf")])
    run, params, _, _ = load_latest(tmp_path / "run")
    hf_config, hf_params, _ = load_pretrained(str(tmp_path / "hf"))
    assert hf_config.lora_rank == 0
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, run.model.vocab_size, (2, 32)), jnp.int32)
    want = GPT(run.model).apply({"params": params}, tokens)
    np.testing.assert_allclose(GPT(hf_config).apply({"params": hf_params}, tokens), want, rtol=1e-4, atol=1e-4)


def test_adapters_resolve_in_a_run_config():
    config = small_run_config()
    config.model.update(lora_rank=8, lora_targets="qkv,out")
    assert resolve(config).model.adapted == ("qkv", "out")


def test_with_lora_embeddings_the_token_tables_train_beside_the_adapters():
    """model.lora_embeddings: the embedding (and an untied head) are trained, so Adam keeps
    their moments too; every other base weight stays frozen. Read from the shapes alone."""
    from jaxgpt.model.lora import adapter_labels
    from jaxgpt.training.optimizer import make_optimizer

    config = small_run_config()
    for tied in (True, False):
        config.model.update(lora_rank=2, lora_embeddings=True, tie_embeddings=tied)
        run = resolve(config, vocab_size=64)
        params = jax.eval_shape(lambda r=run: init_params(r.model, jax.random.key(0)))
        labels = adapter_labels(run.model)(params)
        leaves = jax.tree_util.tree_leaves_with_path(labels)
        trained = {"/".join(k.key for k in path) for path, label in leaves if label == "adapter"}
        tables = {"wte/embedding"} | (set() if tied else {"lm_head/kernel"})
        assert tables <= trained and all(n.endswith(("lora_a", "lora_b")) for n in trained - tables)
        opt_state = jax.eval_shape(make_optimizer(run.train, adapters=run.model).init, params)
        sizes = {"/".join(k.key for k in path): p.size for path, p in jax.tree_util.tree_leaves_with_path(params)}
        assert sum(x.size for x in jax.tree.leaves(opt_state) if x.ndim) == 2 * sum(sizes[n] for n in trained)


def test_the_gradient_is_the_adapters_alone_and_is_theirs_in_the_whole_model():
    """The step differentiates what the adapted model trains and nothing else: its gradient holds
    the adapters alone (no frozen weight's, not even as zeros), summed over two microbatches, and
    each adapter's is the gradient the whole model's loss gives it (jax.grad over every parameter)."""
    microbatches = 2
    from conftest import cross_entropy

    from jaxgpt.training.train_step import gradients

    config = BASE.replace(lora_rank=2)
    model = GPT(config)
    params = randomised_adapters(init_params(config, jax.random.key(0)))
    windows = jnp.asarray(np.random.default_rng(0).integers(0, 64, (4, 17)), jnp.int32)
    step = jax.jit(lambda p: gradients(p, windows, jax.random.key(0), model=model, microbatches=microbatches))
    _, grads = step(params)
    leaves = jax.tree_util.tree_leaves_with_path
    names = {jax.tree_util.keystr(path) for path, _ in leaves(grads)}
    adapters = {jax.tree_util.keystr(path) for path, _ in leaves(params) if is_adapter(path)}
    assert names == adapters and len(adapters) == 2 * 2 * 4  # A and B of 4 projections in each of 2 blocks
    everything = jax.jit(jax.grad(lambda p: cross_entropy(model, p, windows)))(params)
    for path, g in leaves(grads):  # entries ~1e-2, summed in another order: float32's ~1e-7 of them
        want = everything
        for key in path:
            want = want[key.key]
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-6, err_msg=jax.tree_util.keystr(path))
