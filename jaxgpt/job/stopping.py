"""Ending a run early: when asked to (SIGTERM, Ctrl-C), or when training diverges.

Asked to stop, the loop finishes its step, checkpoints and returns, so rerunning continues.
Diverged, it stops at the first non-finite loss, gradient norm or parameter, before anything
non-finite is saved: the newest checkpoint is always one to continue from. A loss can also run
away while staying finite (too high a learning rate: 3.3 climbing to 148), or be hopeless from
its first evaluation on (286 where a uniform guess scores ln V = 2.4, falling slowly);
`RunawayWatch` warns at the first evaluation far above the best, or past warmup more than a nat
worse than a uniform guess, and stops the run when it stays there, and the best checkpoint
outlives pruning (jaxgpt/job/checkpoint.py) for it to go back to.
"""

from __future__ import annotations

import math
import signal
import threading

import jax
import jax.numpy as jnp
import numpy as np

from jaxgpt import interrupts
from jaxgpt.errors import UserError


class StopRequests:
    """A context manager under which SIGTERM/SIGINT set `reason` instead of killing the
    process; a second SIGINT is handled as it was before (a command ends at once, exit 130:
    jaxgpt.commands.interrupt; Python's default raises KeyboardInterrupt). Only the main thread
    may install handlers (not so in a notebook cell run from a thread): elsewhere signals keep
    their defaults."""

    def __init__(self, say):
        self.say = say
        self.reason: str | None = None
        self._previous: dict = {}

    def _request(self, signum, _frame) -> None:
        if signum == signal.SIGINT:
            interrupts.take()  # the command's watcher acts only on one beyond it
        self.reason = signal.Signals(signum).name
        self.say(f"{self.reason}: finishing this step and writing a checkpoint (Ctrl-C again to abort)")
        signal.signal(signal.SIGINT, self._previous.get(signal.SIGINT, signal.default_int_handler))

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._request) for s in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}


def check_finite(fetched: list[dict], first_step: int, params, checkpoints, lr: float) -> None:
    """Raise at the first non-finite loss or gradient norm among the fetched metrics of steps
    first_step, first_step + 1, ..., or if the parameters after them are non-finite."""
    for offset, metrics in enumerate(fetched):
        bad = {k: float(metrics[k]) for k in ("loss", "grad_norm") if not math.isfinite(float(metrics[k]))}
        if bad:
            diverged(first_step + offset, ", ".join(f"{k} became {v}" for k, v in bad.items()), checkpoints, lr)
    if not all_finite(params):
        diverged(first_step + len(fetched) - 1, "parameters became non-finite", checkpoints, lr)


def diverged(step: int, what: str, checkpoints, lr: float) -> None:
    """Raise the one-line error of a divergence, naming the checkpoints to continue from."""
    checkpoints.wait()
    kept = checkpoints.steps()
    lower = f"--config.train.lr={lr / 10:g}"
    if not kept:
        advice = f"no checkpoint was written before it; start again with a lower learning rate ({lower} --fresh)"
    else:
        advice = (
            f"checkpoints {', '.join(map(str, kept))} are kept, all finite. Rerun with a lower learning rate "
            f"({lower}; a resume may change it) to continue from step {kept[-1]}, adding --from_step {kept[0]} "
            "to go back further (later checkpoints are moved aside, not deleted); or start again with --fresh"
        )
    raise UserError(f"training diverged at step {step}: {what}; {advice}")


# How far above its best a validation loss must be to count as running away: a nat, the model
# e (2.7) times more perplexed than at its best, far beyond the evaluation noise of a fixed
# validation set and the spikes of a healthy run; or above ln(vocab), worse than a uniform
# guess. Spikes recover within an evaluation or two; a run still that far off after
# RUNAWAY_EVALUATIONS evaluations in a row has diverged.
RUNAWAY_NATS = 1.0
RUNAWAY_EVALUATIONS = 3


class RunawayWatch:
    """Follows the validation loss evaluation by evaluation: a warning at each evaluation far
    above the best (RUNAWAY_NATS, or ln outputs: of the vocabulary, or a classifier's classes),
    or after `warmup_steps` more than RUNAWAY_NATS above ln outputs (worse than guessing
    uniformly, however it compares with the best), and a UserError once RUNAWAY_EVALUATIONS in
    a row are, naming the best checkpoint `checkpoints` keeps to go back to (or a fresh start,
    where the best is hopeless too). The best is this session's (a resumed run starts watching afresh); the best
    checkpoint is the run's."""

    def __init__(self, outputs: int, checkpoints, warn, warmup_steps: int = 0):
        self.ceiling = math.log(outputs)  # a uniform guess over the model's outputs: tokens, or a classifier's classes
        self.checkpoints, self.warn, self.warmup_steps = checkpoints, warn, warmup_steps
        self.best = math.inf
        self.best_step: int | None = None
        self.far: list[int] = []  # the steps of the evaluations in a row far above the best

    def evaluated(self, step: int, val_loss: float, lr: float) -> None:
        hopeless = step > self.warmup_steps and val_loss > self.ceiling + RUNAWAY_NATS
        if val_loss < self.best:
            self.best, self.best_step = val_loss, step
        elif val_loss > min(self.best + RUNAWAY_NATS, self.ceiling):
            hopeless = True  # far above its best: counted the same way
        if not hopeless:
            self.far = []
            return
        self.far.append(step)
        if self.best_step == step:  # a new best, and still worse than a uniform guess
            uniform = f"ln {math.exp(self.ceiling):.0f} = {self.ceiling:.4f}, a uniform guess's"
            where = f"val loss {val_loss:.4f} at step {step}, more than {RUNAWAY_NATS:g} nat above {uniform}"
        else:
            where = f"val loss {val_loss:.4f} at step {step}, against its best {self.best:.4f} at step {self.best_step}"
        if len(self.far) < RUNAWAY_EVALUATIONS:
            self.warn(
                f"{where}: the loss may be running away; the run stops if it stays this far off for "
                f"{RUNAWAY_EVALUATIONS} evaluations"
            )
            return
        best = self.checkpoints.best()
        back = (
            f"--from_step {best[0]} (the best checkpoint, val loss {best[1]:.4f}, kept)"
            if best and best[1] <= self.ceiling + RUNAWAY_NATS
            else "--fresh (no checkpoint was saved at a sound evaluation)"
        )
        raise UserError(
            f"training ran away: {where}, far above it at the last {RUNAWAY_EVALUATIONS} evaluations (steps "
            f"{', '.join(map(str, self.far))}); rerun with a lower learning rate (--config.train.lr={lr / 10:g}) "
            f"and {back}"
        )


def all_finite(tree) -> bool:
    """Whether every value in `tree` (jax arrays) is finite. Arrays on this process's CPU are
    the host's own memory: numpy reads them in place, with no program to compile (which would
    lengthen a fresh start). Elsewhere one compiled
    reduction on the devices, so that nothing is copied to the host."""
    leaves = jax.tree.leaves(tree)
    if all(x.is_fully_addressable and {d.platform for d in x.devices()} == {"cpu"} for x in leaves):
        return all(bool(np.isfinite(np.asarray(x)).all()) for x in leaves)
    return bool(_all_finite_on_devices(tree))


@jax.jit
def _all_finite_on_devices(tree) -> jax.Array:
    return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in jax.tree.leaves(tree)]))
