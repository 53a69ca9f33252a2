"""Training parity with PyTorch, step by step: jaxgpt's train_step against transformers' models
trained by torch.optim.AdamW, clip_grad_norm_ and a hand-written warmup + cosine schedule.

The same initial weights (a transformers model, converted by jaxgpt.hf), the same 10 batches,
2 microbatches each; after every step: the loss, the gradient norm before clipping, every
parameter's gradient, every parameter after the update. float32 on both sides.

Where jaxgpt differs from PyTorch's defaults on purpose, the PyTorch side is told to do the
same: weight decay on matmul kernels only (embeddings when decay_embeddings), no decay on norms
and biases; a learning rate of 0 at step 0 (linear warmup from 0, as optax's schedule starts).
Needs the optional extras (pip install -r requirements-hf.txt); skipped without them.
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the parity tests need torch: pip install -r requirements-hf.txt")
transformers = pytest.importorskip(
    "transformers", reason="the parity tests need transformers: pip install -r requirements-hf.txt"
)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from conftest import cross_entropy, matrix  # noqa: E402
from test_hf import VOCAB, reference_model  # noqa: E402  (weights of std 0.3, eval mode: no dropout)

from jaxgpt.config import TrainConfig  # noqa: E402
from jaxgpt.hf import FAMILIES, load_pretrained  # noqa: E402
from jaxgpt.model.transformer import GPT  # noqa: E402
from jaxgpt.training.optimizer import make_optimizer  # noqa: E402
from jaxgpt.training.train_step import TrainState, train_step  # noqa: E402

SEQ, BATCH, MICROBATCHES, STEPS = 16, 4, 2, 10
# A large learning rate and a small clip, so that updates move parameters visibly, the warmup
# and the cosine both act within 10 steps, and clipping is active.
TRAIN = dict(steps=STEPS, lr=3e-2, min_lr=3e-3, warmup_steps=3, weight_decay=0.1, beta1=0.9, beta2=0.95, grad_clip=0.5)

# float32 has a 6e-8 unit roundoff; the two sides sum the same products in other orders over
# reductions of at most a few thousand terms, so relative differences of 1e-6..1e-5 are expected
# in losses and gradients. Adam divides each gradient by its own running scale, so an element's
# relative error reaches its update undamped: parameters may differ by a few 1e-6 relative per
# step times the learning rate, accumulated over 10 steps.
LOSS_RTOL, GRAD_RTOL, GRAD_ATOL, PARAM_ATOL = 1e-5, 1e-4, 1e-6, 1e-5
# The same holds for directions with no gradient in exact arithmetic: softmax ignores a shift of
# a query's scores, so GPT-2's key weights along inputs that are constant over positions get
# gradients of rounding size, which Adam scales up. Such elements (measured: 0.07% of GPT-2's,
# none of Llama's, which has no biases) may miss PARAM_ATOL, but by far less than one step of
# the peak learning rate (3e-2; measured at most 3e-5): a wrong update would show as 1e-2.
PARAM_OUTLIERS, PARAM_MAX_GAP = 5e-3, 1e-3


def lr_at(step: int) -> float:
    """Linear warmup from 0, then cosine to min_lr at `steps`: written from the formula, not
    from jaxgpt.training.optimizer."""
    lr, min_lr, warmup, steps = TRAIN["lr"], TRAIN["min_lr"], TRAIN["warmup_steps"], TRAIN["steps"]
    if step < warmup:
        return lr * step / warmup
    progress = min(step - warmup, steps - warmup) / (steps - warmup)
    return min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def decays(name: str, decay_embeddings: bool) -> bool:
    """jaxgpt's mask in Hugging Face names: matrices of linear layers (GPT-2's Conv1D and
    Llama's Linear weights, Llama's untied head), embeddings only if asked."""
    if "wte" in name or "wpe" in name or "embed_tokens" in name:
        return decay_embeddings
    return name.endswith(".weight") and "ln_" not in name and "norm" not in name


def torch_steps(model, batches, decay_embeddings: bool):
    """The reference loop: per step the microbatches' mean losses, each halved and
    backpropagated, clip, AdamW, schedule. Yields (loss, norm, grads, params) per step."""
    named = dict(model.named_parameters())
    groups = [
        {"params": [p for n, p in named.items() if decays(n, decay_embeddings)], "weight_decay": TRAIN["weight_decay"]},
        {"params": [p for n, p in named.items() if not decays(n, decay_embeddings)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=TRAIN["lr"], betas=(TRAIN["beta1"], TRAIN["beta2"]), eps=1e-8)
    for step, windows in enumerate(batches):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        optimizer.zero_grad()
        total = 0.0
        for i in range(MICROBATCHES):
            piece = torch.tensor(windows[i::MICROBATCHES], dtype=torch.long)  # jaxgpt's strided rows
            logits = model(piece[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), piece[:, 1:].reshape(-1))
            (loss / MICROBATCHES).backward()
            total += loss.item() / MICROBATCHES
        grads = {n: p.grad.detach().numpy().copy() for n, p in named.items()}
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), TRAIN["grad_clip"]).item()
        optimizer.step()
        yield total, norm, grads, {n: p.detach().numpy().copy() for n, p in named.items()}


def jax_steps(directory, batches, decay_embeddings: bool):
    config, params, family = load_pretrained(directory)
    to_weights = FAMILIES[family].weights  # jaxgpt layout -> Hugging Face names (a linear relabelling)
    model = GPT(config)
    optimizer = make_optimizer(TrainConfig(**TRAIN, decay_embeddings=decay_embeddings, microbatches=MICROBATCHES))
    params = jax.tree.map(jnp.asarray, params)
    state = TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params), jax.random.key(0))
    step = jax.jit(lambda s, w: train_step(s, w, model=model, optimizer=optimizer, microbatches=MICROBATCHES))

    def loss_of(p, w):  # the step's microbatched loss, to read its gradient
        pieces = [w[i::MICROBATCHES] for i in range(MICROBATCHES)]
        return sum(cross_entropy(model, p, piece) for piece in pieces) / MICROBATCHES

    gradient = jax.jit(jax.grad(loss_of))
    for windows in batches:
        windows = jnp.asarray(windows, jnp.int32)
        grads = to_weights(config, jax.device_get(gradient(state.params, windows)))
        state, metrics = step(state, windows)
        after = to_weights(config, jax.device_get(state.params))
        yield float(metrics["loss"]), float(metrics["grad_norm"]), grads, after


def without_key_bias(params: dict) -> None:
    """Drop GPT-2's key bias from the comparison of parameters. It adds q.b_k to every score of
    a query's row, which softmax ignores: its gradient is 0 up to rounding (checked by the
    gradient comparison, atol GRAD_ATOL), and Adam scales that rounding noise, ~1e-9, up to
    updates of the learning rate's size in a direction each side's rounding picks."""
    for name in [n for n in params if n.endswith("attn.c_attn.bias")]:
        d_model = params[name].shape[0] // 3
        params[name] = np.concatenate([params[name][:d_model], params[name][2 * d_model :]])


def differences(ours: dict, theirs: dict) -> float:
    """Largest elementwise difference, relative to the largest magnitude of that tensor."""
    return max(float(np.max(np.abs(ours[n] - theirs[n])) / (np.max(np.abs(theirs[n])) + 1e-30)) for n in theirs)


@pytest.mark.parametrize(
    "kind, decay_embeddings",
    matrix({"gpt2": "gpt2", "llama": "llama"}, {"no-embedding-decay": False, "embedding-decay": True}),
)
def test_ten_training_steps_match_pytorch(kind, decay_embeddings, tmp_path):
    model = reference_model(kind)
    model.save_pretrained(tmp_path)
    batches = np.random.default_rng(1).integers(0, VOCAB, (STEPS, BATCH, SEQ + 1))
    worst = {"loss": 0.0, "grad_norm": 0.0, "grads": 0.0, "params": 0.0}
    ours_steps = jax_steps(tmp_path, batches, decay_embeddings)
    both = zip(ours_steps, torch_steps(model, batches, decay_embeddings), strict=True)
    clipped = []
    for step, (ours, theirs) in enumerate(both):
        (loss, norm, grads, params), (t_loss, t_norm, t_grads, t_params) = ours, theirs
        assert set(grads) == set(t_grads), "every parameter is compared"
        assert loss == pytest.approx(t_loss, rel=LOSS_RTOL), f"loss at step {step}"
        assert norm == pytest.approx(t_norm, rel=LOSS_RTOL), f"gradient norm at step {step}"
        clipped.append(norm > TRAIN["grad_clip"])
        for name in t_grads:
            np.testing.assert_allclose(grads[name], t_grads[name], rtol=GRAD_RTOL, atol=GRAD_ATOL, err_msg=name)
        without_key_bias(params), without_key_bias(t_params)
        gaps = np.concatenate([np.abs(params[n] - t_params[n]).ravel() for n in t_params])
        assert np.mean(gaps > PARAM_ATOL) <= PARAM_OUTLIERS, f"parameters after step {step}"
        assert gaps.max() <= PARAM_MAX_GAP, f"parameters after step {step}"
        worst["params_outside_atol"] = max(worst.get("params_outside_atol", 0.0), float(np.mean(gaps > PARAM_ATOL)))
        worst["params_max_gap"] = max(worst.get("params_max_gap", 0.0), float(gaps.max()))
        worst["loss"] = max(worst["loss"], abs(loss - t_loss) / abs(t_loss))
        worst["grad_norm"] = max(worst["grad_norm"], abs(norm - t_norm) / t_norm)
        worst["grads"] = max(worst["grads"], differences(grads, t_grads))
        worst["params"] = max(worst["params"], differences(params, t_params))  # key bias left out
    assert any(clipped), "clipping acted in some step, so it is tested"
    print(f"{kind} decay_embeddings={decay_embeddings}: largest relative differences {worst}")
