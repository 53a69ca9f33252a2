"""The mixture-of-experts layer against a float64 NumPy reference written here from the rules
(routing, Mixtral's renormalisation, capacity queues and drops, the two router losses), its
parameter and FLOP counts against closed forms, and its training step."""

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import layout_run_config, small_run_config, train_losses, trained

from jaxgpt import sharding
from jaxgpt.config import ConfigError, MixtureOfExperts, ModelConfig
from jaxgpt.config_files import resolve
from jaxgpt.hardware.mesh_step import jit_train_step, state_layout
from jaxgpt.job.trainer import train_and_evaluate
from jaxgpt.model.layers import ACTIVATION_FUNCTIONS
from jaxgpt.model.moe import MixtureOfExpertsLayer
from jaxgpt.model.transformer import GPT, active_params, count_params, describe_parameters, flops_per_token, init_params
from jaxgpt.training.batch import batch_layout
from jaxgpt.training.optimizer import make_optimizer
from jaxgpt.training.program import training_program
from jaxgpt.training.train_step import create_train_state, gradients, train_step

D, T, BATCH = 16, 10, 3
initialised = jax.jit(init_params, static_argnums=0)  # compiled: eager, a mixture's init dispatches op by op


def model_config(**moe) -> ModelConfig:
    m = dict(experts=4, top_k=2, expert_hidden=24) | moe
    return ModelConfig(vocab_size=32, block_size=T, n_layer=2, n_head=2, d_model=D, moe=MixtureOfExperts(**m))


def reference(x, p, config: ModelConfig) -> tuple[np.ndarray, dict]:
    """The layer, token by token in float64: each sequence a group; assignments queue by
    (slot, token); an expert takes the first `capacity` of its queue."""
    m = config.moe
    x = np.asarray(x, np.float64)
    w = {k: np.asarray(v, np.float64) for k, v in _flat(p).items()}
    t = x.shape[1]
    capacity = min(t, math.ceil(m.capacity_factor * t * m.top_k / m.experts)) if m.capacity_factor else t

    def expert(e, v):
        h = np.einsum("d,d...->...", v, w["experts_up"][e])  # (hidden,), or (2, hidden) gated
        if config.bias:
            h = h + w["experts_up_bias"][e, 0]
        h = h[0] / (1 + np.exp(-h[0])) * h[1] if config.activation == "swiglu" else gelu(h)
        y = h @ w["experts_down"][e]
        return y + w["experts_down_bias"][e, 0] if config.bias else y

    out = np.zeros_like(x)
    aux, z, dropped, load = [], [], 0, np.zeros(m.experts)
    for b in range(x.shape[0]):
        logits = x[b] @ w["router/kernel"]
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        chosen = np.argsort(-probs, axis=-1, kind="stable")[:, : m.top_k]
        weights = np.take_along_axis(probs, chosen, -1)
        if m.renormalize:
            weights /= weights.sum(-1, keepdims=True)
        filled = np.zeros(m.experts, int)
        for k in range(m.top_k):
            for i in range(t):
                e = chosen[i, k]
                if filled[e] < capacity:
                    filled[e] += 1
                    out[b, i] += weights[i, k] * expert(e, x[b, i])
                else:
                    dropped += 1
        f = np.bincount(chosen.ravel(), minlength=m.experts) / chosen.size
        load += f / x.shape[0]
        aux.append(m.experts * np.sum(f * probs.mean(0)))
        z.append(np.mean((np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)) ** 2))
    if m.shared_experts:
        h = gelu(x @ w["shared/up/kernel"] + w.get("shared/up/bias", 0))
        out += h @ w["shared/down/kernel"] + w.get("shared/down/bias", 0)
    total = x.shape[0] * t * m.top_k
    return out, {"aux_loss": np.mean(aux), "z_loss": np.mean(z), "dropped": dropped / total, "load": load}


def gelu(h):
    """GPT-2's tanh approximation (checked against the model's below)."""
    return 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))


def _flat(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        name = f"{prefix}{k}"
        out |= _flat(v, name + "/") if isinstance(v, dict) else {name: v}
    return out


def run_layer(config: ModelConfig, x, params=None):
    layer = MixtureOfExpertsLayer(config)
    params = params if params is not None else jax.jit(layer.init)(jax.random.key(1), x)["params"]
    y, sown = jax.jit(partial(layer.apply, mutable=["router"]))({"params": params}, x)
    return params, np.asarray(y), {k: np.asarray(v[0]) for k, v in sown["router"].items()}


def positive_tokens():
    return jnp.abs(jax.random.normal(jax.random.key(0), (BATCH, T, D))) + 0.1


@pytest.mark.parametrize(
    "moe, bias, activation",
    [
        pytest.param(dict(capacity_factor=1.0), False, "gelu", id="capacity-drops"),
        pytest.param(dict(capacity_factor=0.0), True, "gelu", id="dropless-bias"),
        pytest.param(dict(capacity_factor=1.5, top_k=1, shared_experts=2), True, "gelu", id="top1-shared"),
        pytest.param(dict(capacity_factor=0.0, top_k=1, renormalize=False), False, "gelu", id="top1-switch"),
        pytest.param(dict(capacity_factor=1.25, experts=3), False, "swiglu", id="swiglu"),
    ],
)
def test_the_layer_matches_the_float64_reference(moe, bias, activation):
    """Float32 against float64: each output is a sum over top_k of weighted MLP outputs whose
    matmuls sum 16 and 24 terms, so the float32 rounding is a few 1e-7 relative; 1e-5 leaves
    room for the exp and tanh. The last expert's router column is made strongly negative and
    every token positive, so no token chooses it: the reference and the layer must agree that
    its load is zero."""
    config = model_config(**moe).replace(bias=bias, activation=activation)
    x = positive_tokens()
    params, _, _ = run_layer(config, x)
    params["router"]["kernel"] = params["router"]["kernel"].at[:, -1].set(-1.0)
    _, y, sown = run_layer(config, x, params)
    want, stats = reference(x, params, config)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    for name in ("aux_loss", "z_loss", "dropped"):
        np.testing.assert_allclose(sown[name], stats[name], rtol=1e-5, err_msg=name)
    np.testing.assert_allclose(sown["load"], stats["load"], atol=1e-7)
    assert stats["load"][-1] == 0 == sown["load"][-1]  # the expert no token chose
    if moe["capacity_factor"] == 1.0:
        assert stats["dropped"] > 0  # the case is one where the queues overflow
    if moe["capacity_factor"] == 0.0:
        assert stats["dropped"] == 0


def test_each_sequence_routes_on_its_own():
    """A sequence's output does not depend on the others in the batch (its queues are its own),
    which is what makes microbatches and data parallelism change nothing."""
    config = model_config(capacity_factor=1.0)
    x = positive_tokens()
    params, together, _ = run_layer(config, x)
    alone = np.concatenate([run_layer(config, x[i : i + 1], params)[1] for i in range(BATCH)])
    np.testing.assert_array_equal(together, alone)


def test_parameters_and_flops_per_token_have_closed_forms():
    """n_layer=2 with an MoE layer every second block (block 1), GELU, no biases, RoPE, tied
    embeddings: counted by hand. A token uses top_k=2 of the 4 experts."""
    c = ModelConfig(
        vocab_size=64, block_size=8, n_layer=2, n_head=2, d_model=32, bias=False, norm="rmsnorm", position="rope",
        moe=MixtureOfExperts(experts=4, top_k=2, expert_hidden=48, every=2),
    )  # fmt: skip
    attention = 32 * (2 + 2 + 2) * 16 + 32 * 32  # fused qkv (2 query, 2 key, 2 value heads of 16) and out
    norms = 2 * 32
    dense_mlp = 32 * 128 + 128 * 32  # mlp_hidden = 4 d_model
    router, experts = 32 * 4, 4 * (32 * 48 + 48 * 32)
    total = 64 * 32 + 2 * (attention + norms) + dense_mlp + router + experts + 32  # + the final norm
    active = total - experts // 2
    params = initialised(c, jax.random.key(0))
    assert count_params(params) == total
    assert active_params(c) == active
    assert flops_per_token(c) == 6 * active + 12 * 2 * 32 * 8
    assert describe_parameters(c, params) == f"{total:,} parameters, {active:,} active per token (2 of 4 experts)"


def test_the_objective_adds_the_router_losses_and_the_loss_logged_is_the_cross_entropy():
    config = model_config(capacity_factor=1.25, aux_loss=0.5, z_loss=0.25)
    params = initialised(config, jax.random.key(0))
    windows = jax.random.randint(jax.random.key(1), (BATCH, T + 1), 0, 32)
    model = GPT(config)
    measured, grads = jax.jit(partial(gradients, model=model))(params, windows, jax.random.key(2))
    loss = measured["loss"]
    logits, sown = jax.jit(partial(model.apply, mutable=["router"]))({"params": params}, windows[:, :-1])
    log_p = jax.nn.log_softmax(logits)
    cross_entropy = -jnp.take_along_axis(log_p, windows[:, 1:, None], -1).mean()
    np.testing.assert_allclose(loss, cross_entropy, rtol=1e-6)
    layers = sown["router"]["block_0"]["moe"], sown["router"]["block_1"]["moe"]
    aux = np.mean([layer["aux_loss"][0] for layer in layers])
    z = np.mean([layer["z_loss"][0] for layer in layers])

    def objective(p):  # written out again from the rule: the cross-entropy, then each router loss's share
        logits, sown = model.apply({"params": p}, windows[:, :-1], mutable=["router"])
        log_p = jax.nn.log_softmax(logits)
        layers = [sown["router"][f"block_{i}"]["moe"] for i in range(2)]
        mean = lambda name: jnp.mean(jnp.stack([layer[name][0] for layer in layers]))  # noqa: E731
        return (
            -jnp.take_along_axis(log_p, windows[:, 1:, None], -1).mean()
            + 0.5 * mean("aux_loss")
            + 0.25 * mean("z_loss")
        )

    want = jax.jit(jax.grad(objective))(params)
    for got, expected in zip(jax.tree.leaves(grads), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-7)
    assert float(jnp.abs(grads["block_0"]["moe"]["router"]["kernel"]).max()) > 0
    assert aux > 0 and z > 0


@pytest.fixture(scope="module")
def one_step():
    """A capacity-limited MoE model's state, a batch, and the state and metrics of one step on it."""
    config = model_config(capacity_factor=1.0)
    windows = jax.random.randint(jax.random.key(1), (4, T + 1), 0, 32)
    optimizer = make_optimizer_for_test()
    state = create_train_state(config, optimizer, 0)
    return (
        config,
        optimizer,
        state,
        windows,
        jax.jit(partial(train_step, model=GPT(config), optimizer=optimizer))(state, windows),
    )


def test_microbatches_give_the_same_step(one_step):
    """Routing per sequence: splitting the batch into microbatches changes only float32
    summation order (of the gradient's mean), not which tokens are dropped."""
    config, optimizer, state, windows, (one, metrics_one) = one_step
    step = partial(train_step, model=GPT(config), optimizer=optimizer, microbatches=2)
    two, metrics_two = jax.jit(step)(state, windows)
    np.testing.assert_allclose(metrics_one["loss"], metrics_two["loss"], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(two.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.slow  # a third compile of the MoE step (5 s); tests/test_model.py scans dense blocks in the quick set
def test_scanned_layers_give_the_same_step(one_step):
    from jaxgpt.model.transformer import stack_blocks

    config, optimizer, state, windows, (_, metrics_one) = one_step
    stacked = stack_blocks(state.params, 2)
    scanned_state = state.replace(params=stacked, opt_state=optimizer.init(stacked))
    step = partial(train_step, model=GPT(config.replace(scan_layers=True)), optimizer=optimizer)
    _, metrics_scan = jax.jit(step)(scanned_state, windows)
    np.testing.assert_allclose(metrics_scan["loss"], metrics_one["loss"], rtol=1e-6)


def make_optimizer_for_test():
    from jaxgpt.config import TrainConfig

    return make_optimizer(TrainConfig(steps=10, warmup_steps=1, lr=1e-2))


@pytest.mark.parametrize(
    "moe, fix",
    [
        (dict(experts=1), "model.moe.experts=1 must be at least 2"),
        (dict(experts=4, top_k=5), "model.moe.top_k=5 is more than the 4 experts"),
        (dict(experts=4, every=3), "model.moe.every=3 is more than n_layer=2"),
        (dict(experts=4, capacity_factor=-1.0), "model.moe.capacity_factor=-1.0 must be >= 0"),
    ],
)
def test_a_bad_moe_setting_is_named(moe, fix):
    with pytest.raises(ConfigError, match=fix.replace(".", r"\.")):
        ModelConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, d_model=16, moe=MixtureOfExperts(**moe))


def test_mixed_blocks_cannot_be_scanned_and_experts_need_the_mlp():
    with pytest.raises(ConfigError, match="scan_layers cannot iterate"):
        ModelConfig(n_layer=2, scan_layers=True, moe=MixtureOfExperts(experts=4, every=2))
    with pytest.raises(ConfigError, match="the experts replace the MLP"):
        ModelConfig(n_layer=2, mlp=False, moe=MixtureOfExperts(experts=4))


def test_gelu_reference_is_the_models_gelu():
    h = np.linspace(-4, 4, 9)
    want = np.asarray(ACTIVATION_FUNCTIONS["gelu"](jnp.asarray(h, jnp.float32)))
    got = gelu(h)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # float32's tanh near -1: a few ulps of |h| <= 4


def moe_run_config(mesh: dict, **train):
    config = layout_run_config(mesh, steps=6, **train)
    config.model.moe.update(experts=4, top_k=2, capacity_factor=1.25)
    return config


@pytest.fixture(scope="module")
def moe_on_one_device(tmp_path_factory):
    return trained(tmp_path_factory.mktemp("moe_one_device"), moe_run_config(dict(data=1)))


@pytest.mark.parametrize(
    "mesh",
    [
        pytest.param(dict(data=2, expert=4), id="expert4-data2"),
        pytest.param(dict(data=1, fsdp=2, expert=2, tensor=2), id="every-axis", marks=pytest.mark.slow),
    ],
)
def test_expert_parallel_layouts_train_like_one_device(mesh, moe_on_one_device, tmp_path):
    """8 CPU devices with the experts split over the expert axis: the same float32 math, sums
    re-associated across devices (the tolerance of tests/test_sharding.py, for the same
    reason), while a token sent to the wrong expert would move the loss by far more."""
    train_and_evaluate(moe_run_config(mesh), tmp_path, progress=False)
    np.testing.assert_allclose(train_losses(tmp_path), train_losses(moe_on_one_device), rtol=1e-5)


def test_on_an_expert_axis_each_device_holds_its_experts_and_tokens_travel_all_to_all():
    run = resolve(moe_run_config(dict(data=2, expert=4), microbatches=1), vocab_size=96)
    mesh = sharding.make_mesh(run.mesh, jax.devices())
    program = training_program(run)
    layout, _ = state_layout(program, mesh)
    up = layout.params["block_0"]["moe"]["experts_up"]
    assert up.sharding.shard_shape(up.shape)[0] == 1  # 4 experts over 4 devices of the axis
    text = jit_train_step(program, mesh, layout).lower(layout, batch_layout(program.run, mesh)).compile().as_text()
    assert " all-to-all(" in text


def test_an_expert_axis_needs_experts_it_divides():
    with pytest.raises(ConfigError, match="mesh.expert=2 splits experts over devices, but the model has none"):
        resolve(_with_mesh(dict(expert=2)), vocab_size=96)
    config = moe_run_config(dict(expert=3))
    with pytest.raises(ConfigError, match="mesh.expert=3 does not divide model.moe.experts=4"):
        resolve(config, vocab_size=96)


def _with_mesh(mesh: dict):
    c = small_run_config()
    c.mesh.update(mesh)
    return c


def test_the_router_is_in_the_metrics_and_drawn(moe_on_one_device, tmp_path):
    """Every logged step has, per MoE layer, each expert's share of the assignments (shares of
    one whole), the dropped fraction and the routing entropy (between certain and undecided,
    0 and ln 4 nats); plot --metric expert_load draws them."""
    from jaxgpt.commands.plot import expert_loads, plot_runs
    from jaxgpt.job.metrics import read_metrics

    records = read_metrics(moe_on_one_device)
    for record in records:
        for layer in (0, 1):
            loads = [record[f"router/block_{layer}/load/{e}"] for e in range(4)]
            assert math.isclose(sum(loads), 1.0, rel_tol=1e-5) and min(loads) >= 0
            assert 0 <= record[f"router/block_{layer}/dropped"] <= 1
            assert 0 <= record[f"router/block_{layer}/entropy"] <= math.log(4) + 1e-6
        assert record["router/aux_loss"] > 0 and record["router/z_loss"] > 0
    curves = expert_loads(records)
    assert list(curves) == ["block_0", "block_1"] and curves["block_0"][0] == [r["step"] for r in records]
    out = plot_runs([moe_on_one_device], "expert_load", tmp_path / "load.png")
    assert out.stat().st_size > 10_000


def test_capture_gives_each_tokens_experts_and_the_table_prints_them():
    from jaxgpt.lab.capture import capture, expert_table

    config = model_config(capacity_factor=1.0)
    params = initialised(config, jax.random.key(0))
    tokens = np.arange(T)[None] % 32
    captured = capture(config, params, tokens)
    assert captured.experts.shape == captured.expert_weights.shape == (2, 1, T, 2)
    assert captured.experts.min() >= 0 and captured.experts.max() < 4
    assert (captured.experts[..., 0] != captured.experts[..., 1]).all()  # two different experts
    np.testing.assert_allclose(captured.expert_weights.sum(-1), 1, rtol=1e-6)
    assert (captured.expert_weights[..., 0] >= captured.expert_weights[..., 1]).all()  # most probable first
    table = expert_table(captured, [str(t) for t in range(T)], config.moe_layers).splitlines()
    assert table[0].split() == ["token", "block_0", "block_1"] and len(table) == T + 1
    e, w = captured.experts[1, 0, 3], captured.expert_weights[1, 0, 3]
    assert f"{e[0]}:{w[0]:.2f} {e[1]}:{w[1]:.2f}" in table[4]
    dense = capture(config.replace(moe=None), initialised(config.replace(moe=None), jax.random.key(0)), tokens)
    assert dense.experts.shape == (0, 1, T, 0)


def test_top1_routing_learns_from_the_task_only_without_renormalising():
    """At top_k=1, renormalising the chosen expert's probability makes its weight p / p = 1
    whatever the router says, so the task's loss cannot reach the router: its gradient is
    g / p - g p / p**2, zero but for float32 rounding. Weighing by p itself (Switch Transformer)
    passes the loss's gradient to the router. The auxiliary losses are off, so the task is all
    the router could learn from; the same parameters, tokens and target in both."""
    x = positive_tokens()
    target = jax.random.normal(jax.random.key(5), x.shape)
    params, _, _ = run_layer(model_config(top_k=1), x)

    def router_gradient_norm(renormalize):
        layer = MixtureOfExpertsLayer(model_config(top_k=1, renormalize=renormalize))

        def task_loss(router_kernel):
            y, _ = layer.apply({"params": params | {"router": {"kernel": router_kernel}}}, x, mutable=["router"])
            return jnp.mean((y - target) ** 2)

        return float(jnp.linalg.norm(jax.jit(jax.grad(task_loss))(params["router"]["kernel"])))

    renormalised, switch = router_gradient_norm(True), router_gradient_norm(False)
    assert switch > 1e-5, switch  # a real gradient: the loss is O(1), the weights O(0.3)
    assert renormalised < 1e-4 * switch, (renormalised, switch)  # rounding, four orders below


def test_the_load_balancing_loss_moves_a_skewed_router_toward_balance():
    """A router whose first expert takes every token, trained on the load-balancing loss alone
    (experts x sum_e f_e P_e: 4 when one expert takes everything, 1 when balanced; the fractions
    f_e are counts without a gradient, the mean probabilities P_e carry it). Gradient descent
    pushes the loaded expert's probability down; these alike tokens then move together, so the
    load swings between experts rather than settling, but over steps 100 to 200 the loss
    averages 1.13 (measured; 1.47 at twice the step). A loss whose gradient were stopped would
    leave the router at 3.98 throughout."""
    config = model_config(top_k=1, renormalize=False)
    x = positive_tokens()
    params, _, _ = run_layer(config, x)
    skewed = params["router"]["kernel"].at[:, 0].add(0.5)  # every token is positive: expert 0 wins
    layer = MixtureOfExpertsLayer(config)

    def aux_loss(kernel):
        _, sown = layer.apply({"params": params | {"router": {"kernel": kernel}}}, x, mutable=["router"])
        return sown["router"]["aux_loss"][0]

    def descend(kernel, _):
        return kernel - 0.05 * jax.grad(aux_loss)(kernel), aux_loss(kernel)

    _, losses = jax.jit(lambda k: jax.lax.scan(descend, k, None, length=200))(skewed)
    assert losses[0] > 3.9  # the skew: (nearly) every token on one expert
    assert float(np.mean(losses[100:])) < 2.0, losses[100:]


@pytest.mark.parametrize("objective", ["masked", "pairs"])
def test_experts_under_another_objective_train_through_their_evaluations(objective, tmp_path):
    """A masked-token encoder and a decoder on text pairs, each with experts: every evaluation's
    router statistics are averaged over its batches like its losses (they crashed the first one:
    `TypeError: unsupported operand type(s) for *: 'dict' and 'float'`)."""
    from jaxgpt.job.metrics import read_metrics

    config = layout_run_config(dict(data=1), steps=4, eval_every=2, checkpoint_every=4)
    config.model.moe.update(experts=4, top_k=2)
    if objective == "masked":
        config.model.update(causal=False, objective="masked")
    else:
        config.data.source = "builtin:dates"
    trained(tmp_path, config)
    evaluations = [r for r in read_metrics(tmp_path) if "val_loss" in r]
    assert [r["step"] for r in evaluations] == [2, 4] and all(np.isfinite(r["val_loss"]) for r in evaluations)


def test_a_top_one_router_that_renormalises_is_named_when_the_config_is_read():
    """moe.top_k=1 with moe.renormalize's default trains a router the task never reaches (the one
    weight is exactly 1; test above): the run says so in one line at its start, and not once
    renormalize is off or top_k above 1."""
    from conftest import small_run_config

    from jaxgpt.config_files import resolve

    def notes(**moe):
        config = small_run_config()
        config.model.moe.update(experts=4, **moe)
        said: list[str] = []
        resolve(config, vocab_size=96, notes=said)
        return [line for line in said if "router" in line]

    (line,) = notes(top_k=1)
    assert "model.moe.top_k=1 with renormalize=True" in line and "--config.model.moe.renormalize=false" in line
    assert notes(top_k=1, renormalize=False) == [] and notes(top_k=2) == []
