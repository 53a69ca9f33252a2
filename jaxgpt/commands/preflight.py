"""Pre-flight checks of a config before a long run (`python -m jaxgpt check` runs them).

Runs, on the config's own model, data and mesh (a minute or less for small configs on CPU),
the checks the transformer literature recommends before spending real compute (Karpathy,
"A recipe for training neural networks", 2019):
  initial loss    at initialisation the model should be unsure of every token: cross-entropy
                  near ln(vocab_size) (a classifier's: ln(classes)). Far above it means an init
                  scale that is too large.
  gradients       per layer at initialisation: none zero (a disconnected layer), none
                  non-finite, global norm not exploding.
  overfit         one batch trained repeatedly must be learnt: the loss falls below half of
                  where it started. If it cannot, nothing bigger will train either.
  size            parameters and training FLOPs per token (information).
  memory          parameters, optimizer state and the compiled step's temporaries per device
                  against what one device has.
  kv cache        bytes sampling keeps per token and per full context (information).
  why sqrt(d_k)   the variance of q.k for the model's head_dim, and the attention entropy and
                  largest weight with and without the 1/sqrt(head_dim) scale: at the config's
                  init and at unit-variance q and k (information).
"""

from __future__ import annotations

import dataclasses
import math
import time
from functools import partial

import jax
import numpy as np

from jaxgpt import data, sharding
from jaxgpt.config import with_train
from jaxgpt.config_files import resolve
from jaxgpt.errors import UserError
from jaxgpt.hardware import memory
from jaxgpt.model.transformer import active_params, count_params, describe_parameters, flops_per_token
from jaxgpt.training.objectives import objective_of
from jaxgpt.training.train_step import gradient_norms, per_layer

INITIAL_LOSS_TOLERANCE = 0.25  # |loss - ln V| / ln V; GPT-2's init lands within a few percent
GRAD_NORM_LIMIT = 100.0  # global gradient norm at init; a healthy GPT is around 1


@dataclasses.dataclass
class Row:
    name: str
    passed: bool | None  # None: information only
    detail: str


def run_checks(config, overfit_steps: int, overrides=()) -> list[Row]:
    """Every check, in the order of the table, on the config's model, data and mesh (a run
    starting from weights: their model, as training reads it, `overrides` set on purpose)."""
    from jaxgpt.job.pretrained import values_set, with_source_architecture
    from jaxgpt.job.setup import with_vocabulary

    given = values_set(config, overrides)
    run = with_source_architecture(resolve(config), given)  # checked before the data is prepared, as training
    dataset = data.prepare(run.data, progress=False)
    run = with_vocabulary(run, dataset.tokenizer)
    data.check_batches_fit(dataset, run)
    from jaxgpt.hardware import runtime
    from jaxgpt.hardware.mesh_step import state_layout
    from jaxgpt.hardware.step_choice import choose_step
    from jaxgpt.training.program import training_program

    mesh = sharding.make_mesh(run.mesh, runtime.mesh_devices())
    program = training_program(run)
    layout, create = state_layout(program, mesh)
    sized = [size_row(layout.params, run.model), kv_cache_row(run.model)]  # from shapes: nothing allocated
    try:
        memory.check_fits(run, mesh, layout)  # as training does, before any state or batch exists
    except UserError:
        print_table(sized)  # what the model is, even where it cannot train (a 7B model's count on a laptop)
        raise
    # The step this run trains with here (per CPU core, or over the mesh), with its microbatches:
    # the memory row measures that program.
    program, step, _ = choose_step(program, mesh, layout)
    run = program.run
    train, _ = data.batch_sources(dataset, run)
    batch = train.batch(run, mesh, 0, data.TRAIN_STREAM)
    # The same rows, placed as the step takes them (over the cores, when it runs one program per core).
    step_batch = batch if step.batch_mesh is mesh else train.batch(run, step.batch_mesh, 0, data.TRAIN_STREAM)
    own = create()
    memory_check = memory_row(step.compile(own, step_batch), own, mesh)
    del own  # its buffers: a large model's check holds one state at a time
    rows, overfit = learning_rows(run, mesh, batch, step_batch, overfit_steps)
    return rows + [
        overfit,
        sized[0],
        memory_check,
        sized[1],
        *score_scale_rows(run.model),
    ]


def initial_loss_row(initial: float, outputs: int) -> Row:
    """`outputs`: what the model chooses among, the vocabulary or a classifier's classes."""
    uniform = math.log(outputs)
    off = abs(initial - uniform) / uniform
    return Row(
        "initial loss",
        off <= INITIAL_LOSS_TOLERANCE,
        f"{initial:.3f} vs ln({outputs}) = {uniform:.3f} ({off:.0%} off; limit {INITIAL_LOSS_TOLERANCE:.0%})",
    )


def gradients_row(norms: dict[str, float]) -> Row:
    total = math.sqrt(sum(n * n for n in norms.values()))
    dead = [k for k, n in norms.items() if n == 0.0]
    bad = [k for k, n in norms.items() if not math.isfinite(n)]
    smallest, largest = min(norms, key=norms.get), max(norms, key=norms.get)
    if dead:
        problem = f"zero in {', '.join(dead)}; "
    elif bad:
        problem = f"not finite in {', '.join(bad)}; "
    elif total > GRAD_NORM_LIMIT:
        problem = f"exploding (limit {GRAD_NORM_LIMIT:g}); "
    else:
        problem = ""
    return Row(
        "gradients",
        not problem,
        f"{problem}global norm {total:.3g}; smallest {smallest} {norms[smallest]:.3g}, largest {largest} "
        f"{norms[largest]:.3g}",
    )


def overfit_row(compiled_step, state, batch, steps: int, lr: float, same_draws: bool = False):
    """(the state after `steps` steps on one batch, the row judging how far its loss fell).
    same_draws (an objective that draws what it scores from the step's key, the masked one's
    hidden positions): every step draws the same, the step number held at its first value
    (the optimizer counts its own steps), so the one batch is one task to learn rather than a
    new one each step."""
    start = time.perf_counter()
    first, step_zero = None, np.asarray(jax.device_get(state.step))
    for _ in range(steps):
        if same_draws:  # a fresh array each step: the compiled step consumes (donates) its state
            state = state.replace(step=jax.device_put(step_zero, state.step.sharding))
        state, metrics = compiled_step(state, batch)
        loss = float(metrics["loss"])
        first = first if first is not None else loss
    row = Row(
        "overfit one batch",
        loss < 0.5 * first,
        f"loss {first:.3f} -> {loss:.3f} in {steps} steps at lr {lr:g} ({time.perf_counter() - start:.1f} s)"
        + (", the same tokens hidden each step" if same_draws else "")
        + "; must fall below half",
    )
    return state, row


def size_row(params, model_config) -> Row:
    flops = flops_per_token(model_config, model_config.block_size, params)
    detail = f"{describe_parameters(model_config, params)}; {flops / 1e6:,.1f} MFLOPs per token trained (6N + 12LdT"
    if model_config.moe is None:
        return Row("size", None, detail + ")")
    every_expert = flops + 6 * (count_params(params) - active_params(model_config, params))
    return Row("size", None, detail + f", N the active parameters; {every_expert / 1e6:,.1f} were every expert used)")


def learning_rows(run, mesh, batch, step_batch, overfit_steps: int) -> tuple[list[Row], Row]:
    """(the initial loss and gradients rows, the overfit row) of a fresh state: whether the
    model can learn, not what the schedule does in its first steps, so the same kind of step
    with the same microbatches at a constant learning rate with no weight decay."""
    from jaxgpt.hardware.mesh_step import state_layout
    from jaxgpt.hardware.step_choice import choose_step
    from jaxgpt.training.program import training_program

    t = run.train
    steady = with_train(run, warmup_steps=0, steps=10**9, min_lr=t.lr, weight_decay=0.0)
    steady_program = training_program(steady)
    steady_layout, steady_create = state_layout(steady_program, mesh)
    _, learner, _ = choose_step(steady_program, mesh, steady_layout)
    state = steady_create()

    @jax.jit
    @partial(sharding.traced_on, mesh)
    def loss_and_norms(params, batch):
        (_, measured), grads = jax.value_and_grad(lambda p: _objective(run.model, p, batch), has_aux=True)(params)
        return measured["loss"], gradient_norms(grads)

    initial, norms = loss_and_norms(state.params, batch)
    rows = [initial_loss_row(float(initial), run.model.outputs), gradients_row(per_layer(norms))]
    draws = objective_of(run.model).draws_each_step
    _, overfit = overfit_row(learner.compile(state, step_batch), state, step_batch, overfit_steps, t.lr, draws)
    return rows, overfit


def kv_cache_row(model_config) -> Row:
    """What sampling keeps per token: the number GQA and MQA exist to shrink."""
    from jaxgpt.model.kv_cache import cache_bytes

    c = model_config
    if not objective_of(c).reads_the_past:
        return Row("kv cache", None, f"none: {objective_of(c).described.split(', ')[0]} reads its whole input at once")
    decoding = model_config.replace(dtype="float32")  # as sample.py decodes
    per_token = cache_bytes(decoding, 1)
    return Row(
        "kv cache",
        None,
        f"{per_token:,} bytes per token (2 x {c.n_layer} layers x {c.n_kv_head} of {c.n_head} heads as key/value "
        f"heads x {c.head_dim} x 4 bytes, float32 as sample.py decodes); "
        f"{cache_bytes(decoding, c.block_size) / 2**20:,.2f} MiB per sequence of block_size={c.block_size}",
    )


def score_statistics(head_dim: int, std: float, keys: int, queries: int = 256, seed: int = 0) -> dict:
    """Sampled q.k scores of `queries` queries over `keys` keys, every entry of q and k drawn
    from N(0, std^2): the variance of q.k (in theory head_dim * std^4), and, with the scores
    divided by sqrt(head_dim) ("scaled") and not ("unscaled"), the mean entropy of the softmax
    (nats; uniform is ln keys) and the mean largest weight (uniform is 1 / keys)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((queries, head_dim)) * std
    k = rng.standard_normal((queries, keys, head_dim)) * std
    dots = np.einsum("qd,qkd->qk", q, k)
    stats = {"variance": float(dots.var())}
    for name, scale in (("scaled", 1 / math.sqrt(head_dim)), ("unscaled", 1.0)):
        scores = dots * scale
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        entropy = -np.sum(weights * np.log(np.maximum(weights, 1e-300)), axis=-1)
        stats[name] = {"entropy": float(entropy.mean()), "max_weight": float(weights.max(-1).mean())}
    return stats


def score_scale_rows(model_config) -> list[Row]:
    """Why scores are divided by sqrt(d_k) (Vaswani et al. 2017, footnote 4), in numbers for
    this model: q.k sums head_dim products, so its variance is head_dim * var(q) * var(k); at
    unit-variance q and k the unscaled softmax is nearly one-hot (saturated: its gradient
    vanishes), the scaled one is not. At a 0.02 init the queries are small and both stay
    near uniform, which is why the switch alone does not show it early in training."""
    c = model_config
    keys = min(c.block_size, 1024)
    # A norm's output has unit-variance features, so a query entry (a sum of d_model of them
    # times N(0, init_std^2) weights) has std sqrt(d_model) * init_std; qk_norm makes it 1.
    init_std = 1.0 if c.qk_norm else math.sqrt(c.d_model) * c.init_std
    rows = []
    for where, std in ((f"at init (q, k entries of std {init_std:.3g})", init_std), ("at unit-variance q, k", 1.0)):
        s = score_statistics(c.head_dim, std, keys)
        scaled, unscaled = s["scaled"], s["unscaled"]
        rows.append(
            Row(
                "why sqrt(d_k)",
                None,
                f"{where}: var(q.k) {s['variance']:.3g} (theory {c.head_dim * std**4:.3g}); over {keys} keys, "
                f"entropy {scaled['entropy']:.2f} and max weight {scaled['max_weight']:.3f} with the "
                f"1/sqrt({c.head_dim}) scale, {unscaled['entropy']:.2f} and {unscaled['max_weight']:.3f} without "
                f"(uniform: {math.log(keys):.2f} and {1 / keys:.3f})",
            )
        )
    return rows


def memory_row(compiled_step, state, mesh) -> Row:
    """What the run's compiled step needs of each device: its state, and the step's temporaries."""
    analysis = compiled_step.memory_analysis()
    params_bytes = memory.bytes_per_device(state.params)
    opt_bytes = memory.bytes_per_device(state.opt_state)
    temp_bytes = analysis.temp_size_in_bytes if analysis else 0
    need = params_bytes + opt_bytes + temp_bytes
    have = memory.device_memory_bytes(mesh.devices.flat[0])
    return Row(
        "memory",
        need <= have if have else None,
        f"per device: params {params_bytes / 2**20:,.1f} MiB + optimizer {opt_bytes / 2**20:,.1f} MiB + step "
        f"temporaries {temp_bytes / 2**20:,.1f} MiB = {need / 2**30:,.2f} GiB of "
        + (f"{have / 2**30:,.1f} GiB" if have else "unknown")
        + f" (mesh {dict(mesh.shape)})",
    )


def _objective(model_config, params, batch):
    """(what training differentiates, what it measures: "loss" the objective's alone) of a
    batch, without dropout; the masked objective's hidden positions those evaluation draws."""
    from jaxgpt.model.transformer import GPT
    from jaxgpt.training.train_step import EVALUATION_MASKS, scored

    return scored(GPT(model_config), params, batch, jax.random.key(EVALUATION_MASKS))


def print_table(rows: list[Row]) -> None:
    width = max(len(r.name) for r in rows)
    for r in rows:
        status = "INFO" if r.passed is None else "PASS" if r.passed else "FAIL"
        print(f"{status:4}  {r.name:{width}}  {r.detail}")
