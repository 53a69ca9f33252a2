"""The training program: what a run computes, built once from its config before any device is
chosen. The model, the optimizer with its learning-rate schedule, and the pure functions of
jaxgpt/training/train_step.py bound to them:

    run ──► training_program ──► TrainingProgram(model, optimizer, schedule, objective)
                                     │ create_state, step, eval_step
                                     ▼
            jaxgpt/hardware/: placed and compiled (one program over a mesh, or one per CPU core)
            jaxgpt/job/trainer.py: runs it, logging the learning rate `schedule` gives

The hardware layer builds no model and no optimizer: it lays out what `create_state` makes and
compiles what `step` computes. The learning rate the trainer logs is the schedule the optimizer
applies, the same object.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import optax

from jaxgpt.config import RunConfig, with_train
from jaxgpt.model.transformer import GPT
from jaxgpt.training.objectives import Objective, training_objective
from jaxgpt.training.optimizer import learning_rate_schedule, make_optimizer
from jaxgpt.training.train_step import TrainState, create_train_state, eval_step, train_step


@dataclasses.dataclass(frozen=True)
class TrainingProgram:
    run: RunConfig
    model: GPT
    optimizer: optax.GradientTransformation
    schedule: optax.Schedule  # the learning rate at each step, as the optimizer applies it
    objective: Objective  # what the model is trained to predict, and what its evaluation reports

    def with_train(self, **changes) -> TrainingProgram:
        """The same model and optimizer taking their batches otherwise (microbatches, one
        core's share of the rows): fields of train that change neither."""
        assert set(changes) <= {"microbatches", "batch_size"}, changes  # the optimizer reads the rest
        return dataclasses.replace(self, run=with_train(self.run, **changes))

    def create_state(self, seed: int | jax.Array) -> TrainState:
        """Step 0's state from train.seed (or its key data: a compiled initialisation takes it
        as an argument, so runs that differ only in seed share one program)."""
        return create_train_state(self.run.model, self.optimizer, seed)

    @property
    def step(self):
        """(state, windows) -> (state, metrics): `train_step` over the run's microbatches."""
        return partial(
            train_step,
            model=self.model,
            optimizer=self.optimizer,
            microbatches=self.run.train.microbatches,
            layer_grad_norms=self.run.train.log_layer_grad_norms,
            objective=self.objective,
        )

    @property
    def eval_step(self):
        """(params, windows) -> the batch's losses: `eval_step`."""
        return partial(eval_step, model=self.model, objective=self.objective)


def training_program(run: RunConfig) -> TrainingProgram:
    """The program `run` (every field resolved) trains with."""
    schedule = learning_rate_schedule(run.train)
    optimizer = make_optimizer(run.train, schedule, adapters=run.model if run.model.lora_rank else None)
    return TrainingProgram(run, GPT(run.model), optimizer, schedule, training_objective(run))
