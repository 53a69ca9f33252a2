"""Everything a run does before its first step, as stages read top to bottom (the trainer calls
them in this order, and nothing before the loop happens anywhere else):

  resolve_run   the config checked and resolved once (a run starting from weights given their
                model: jaxgpt/job/pretrained.py): its data prepared, vocab_size filled in,
                its training program built (jaxgpt/training/program.py: model, optimizer, schedule), and
                the run checked against the data and this machine's memory from shapes alone,
                before a workdir, a state or a batch exists
  opened        the workdir made (an earlier run moved aside for --fresh) and locked
  place_run     the step chosen for the mesh (one program per CPU core, or one over the mesh:
                jaxgpt/hardware/step_choice.py) and set compiling, beside the state's
                initialisation, with the figures the loop reports against (tokens per step,
                FLOPs per token, peak)
  loop_inputs   what the loop reads beside the step: step 0's state born sharded, the
                checkpoints opened, the validation set, the questions; the trainer takes them
                and alone holds the state
  write_run     config.json and tokenizer.json, once the workdir's checkpoints are known to
                belong to this run
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import NamedTuple

import jax
from jax.experimental import multihost_utils

from jaxgpt import data, sharding
from jaxgpt.config import RunConfig
from jaxgpt.config_files import resolve, tokens_needed, with_tokenizer_vocab
from jaxgpt.data.rollouts import Rollouts
from jaxgpt.errors import UserError
from jaxgpt.hardware import memory, runtime
from jaxgpt.hardware.mesh_step import in_background, state_layout
from jaxgpt.hardware.peak_flops import peak_flops
from jaxgpt.hardware.step_choice import Step, choose_step
from jaxgpt.job import workdir as run_dir
from jaxgpt.job.checkpoint import Checkpoints, scheduled_steps
from jaxgpt.job.metrics import check_sinks_available
from jaxgpt.job.pretrained import (
    check_init_from_run,
    is_run,
    kept_tokenizer,
    refuse_another_tokenizer,
    resumed_model,
    values_set,
    with_source_architecture,
)
from jaxgpt.lab import multiple_choice, watch
from jaxgpt.model.kernels import kernel_fallback
from jaxgpt.model.transformer import describe_parameters, flops_per_token
from jaxgpt.tokenizers import base_tokenizer, load_tokenizer, save_tokenizer
from jaxgpt.training.batch import batch_layout
from jaxgpt.training.program import TrainingProgram, training_program
from jaxgpt.training.train_step import TrainState


def check_stops(stop_at: int | None, from_step: int | None, resumed_at: int | None = None, every: int = 1) -> None:
    """One line for a --stop_at that could never be reached: not after --from_step, not a
    multiple of `every` (train.rl.updates: a run stops between batches of answers), or (once the
    run is restored) at or before the step it resumes from."""
    if stop_at is not None and stop_at % every:
        raise UserError(f"--stop_at {stop_at} is within a batch of answers (train.rl.updates={every}); give a multiple")
    if stop_at is not None and from_step is not None and stop_at <= from_step:
        raise UserError(f"--stop_at {stop_at} is not after --from_step {from_step}; give a later step to stop at")
    if stop_at is not None and resumed_at is not None and stop_at <= resumed_at:
        raise UserError(
            f"--stop_at {stop_at} is at or before step {resumed_at}, where this run resumes; give a later "
            f"step (or --from_step {stop_at} to go back to a kept checkpoint)"
        )


@dataclasses.dataclass
class ResolvedRun:
    run: RunConfig  # every field filled in, vocab_size from the data
    program: TrainingProgram  # what the run computes, built once
    dataset: data.Dataset
    notes: list[str]  # what resolving changed, for the start-up lines
    mesh: jax.sharding.Mesh  # the devices the run's state is laid out over
    layout: TrainState  # the state's shapes, dtypes and shardings on the mesh, nothing allocated
    create: Callable[[], TrainState]  # the compiled initialisation that makes that state


def check_runnable(config, notes: list[str] | None = None, overrides=(), workdir: Path | None = None) -> RunConfig:
    """The run `config` describes, if it can train here: a valid config (starting from weights,
    their model, as jaxgpt/job/pretrained.py says: `overrides` are the config keys set on
    purpose, and a `workdir` that continues such a run keeps its own), its logging sinks
    installed, its attention kernel available on this backend; else one UserError line."""
    run = config if isinstance(config, RunConfig) else resolve(config, notes=notes)
    continued = resumed_model(workdir, run.train.init_from) if workdir is not None else None
    given = values_set(config if not isinstance(config, RunConfig) else run.to_dict(), overrides)
    run = with_source_architecture(run, given, notes, continued)
    check_init_from_run(run)
    check_sinks_available(run.train.wandb_project)
    if why := watch.refusal(run):
        raise UserError(why)
    kernel_fallback(run.model.attention, jax.default_backend(), training=True)
    return run


def with_vocabulary(run: RunConfig, tokenizer) -> RunConfig:
    """`run` with its classifier's labels counted (`with_classes`) and model.vocab_size the
    tokenizer's (a character corpus's), or where it starts from weights, their rows, which the
    tokenizer must fill."""
    run = with_classes(run)  # a classifier's count of labels, which no vocabulary changes
    if run.train.init_from:
        return with_source_vocabulary(run, tokenizer)
    return with_tokenizer_vocab(run, tokenizer.vocab_size)


def with_classes(run: RunConfig) -> RunConfig:
    """`run` with model.classes its labelled texts' or images' labels (jaxgpt/data/labels.py,
    images.py), where it classifies them and left the count unset; one line where a count set differs."""
    if not (run.data.labelled or run.data.images):
        return run
    names = data.class_names(run.data.source)
    if run.model.classes in (0, len(names)):
        return dataclasses.replace(run, model=run.model.replace(classes=len(names)))
    raise UserError(
        f"model.classes={run.model.classes}, but data.source {run.data.source} has {len(names)} labels "
        f"({', '.join(names[:8])}{', ...' if len(names) > 8 else ''}); leave model.classes unset"
    )


def with_source_vocabulary(run: RunConfig, tokenizer) -> RunConfig:
    """Once the tokenizer is known: the vocabulary of the weights' rows, which the tokenizer
    must fill (its base, before the chat template's tokens, which add rows of their own);
    else one line naming the tokenizer that goes with the weights."""
    rows, source = run.model.vocab_size, run.train.init_from
    if is_run(source) and (Path(source) / "tokenizer.json").is_file():  # the tokenizers compared themselves
        refuse_another_tokenizer(source, load_tokenizer(Path(source) / "tokenizer.json"), tokenizer)
    needed = tokens_needed(run.model, base_tokenizer(tokenizer).vocab_size)
    grown = tokens_needed(run.model, tokenizer.vocab_size)  # the chat template's tokens after the weights' rows
    if rows not in (needed, grown):  # a base's rows, or a chat run's, which has the template's tokens already
        raise UserError(
            f"train.init_from={source}'s weights have {rows:,} token rows, and data.tokenizer={run.data.tokenizer} "
            f"gives {needed:,} tokens, whose ids would read other tokens' rows; fine-tune with the tokenizer the "
            "weights were trained with (the run's workdir, the folder's own, or gpt2 for GPT-2)"
        )
    return dataclasses.replace(run, model=run.model.replace(vocab_size=grown))


def resolve_run(config, workdir: Path, *, progress: bool, verify_data: bool, overrides=(), fresh=False) -> ResolvedRun:
    """Stage 1: the run, checked and resolved, and its prepared data."""
    run_dir.check_not_under_a_file(workdir)  # before the slow work, not after it
    notes: list[str] = []
    continuing = None if fresh else workdir
    run = check_runnable(config, notes, overrides, continuing)  # every check that needs no data, before the slow work
    kept = None if fresh else kept_tokenizer(workdir, run)  # a resume's own, where its source changed
    dataset = data.prepare(run.data, progress=progress, verify=verify_data, check_in_background=True, tokenizer=kept)
    run = with_vocabulary(run, dataset.tokenizer)
    data.check_batches_fit(dataset, run)
    program = training_program(run)
    mesh = sharding.make_mesh(run.mesh, runtime.mesh_devices())
    layout, create = state_layout(program, mesh)  # computed once, passed on to every stage that needs it
    memory.check_fits(run, mesh, layout)
    return ResolvedRun(run, program, dataset, notes, mesh, layout, create)


@contextlib.contextmanager
def opened(workdir: Path, *, fresh: bool, main: bool, say):
    """Stage 2: the workdir, made and (by the main process) locked for the run's whole length."""
    if fresh and main and workdir.exists() and any(workdir.iterdir()):
        say(f"--fresh: moved the earlier run to {run_dir.move_aside(workdir)}")
    if fresh and jax.process_count() > 1:
        multihost_utils.sync_global_devices("jaxgpt: workdir moved aside")
    run_dir.make(workdir)
    with run_dir.locked(workdir) if main else contextlib.nullcontext():
        yield


@dataclasses.dataclass
class PlacedRun:
    program: TrainingProgram  # train.microbatches filled in by the step's choice
    mesh: jax.sharding.Mesh
    step: Step
    tokens_per_step: int
    flops_per_token: float
    peak_flops: float  # of all the mesh's devices, what MFU is measured against
    peak_source: str  # where that figure comes from, said once at the start
    compiling: Future  # the step compiling for the state's and batches' shapes: its seconds

    @property
    def run(self) -> RunConfig:
        return self.program.run

    def describe(self, state: TrainState) -> str:
        """The start-up line for `state` (step 0's, or as restored: the same shapes and layout):
        the model's size, the mesh, the memory per device, the peak."""
        mesh = self.mesh
        axes = ", ".join(f"{axis}={size}" for axis, size in mesh.shape.items())
        return (
            f"model: {describe_parameters(self.run.model, state.params)}, {self.tokens_per_step:,} tokens/step; "
            f"mesh {axes} over {mesh.size} x {jax.devices()[0].device_kind}; per device: params "
            f"{memory.bytes_per_device(state.params) / 2**20:,.1f} MiB, optimizer state "
            f"{memory.bytes_per_device(state.opt_state) / 2**20:,.1f} MiB; peak {self.peak_flops / 1e9:,.0f} "
            f"GFLOP/s ({self.peak_source})"
        )


def place_run(resolved: ResolvedRun, say) -> PlacedRun:
    """Stage 3: the run on this machine's devices."""
    mesh = resolved.mesh
    # The workdir is the run's now: the state will be created, and its program compiles beside the step's
    resolved.create.compile_in_background()
    program, step, note = choose_step(resolved.program, mesh, resolved.layout)
    if note:
        say(note)

    def compile_step() -> float:
        # from shapes alone, as choosing the microbatches compiles (a restored state and the first
        # batch have the same): the step then compiles beside the state's initialisation and the
        # data's reading: where XLA's compiles leave cores idle, a fresh start is shorter
        started = time.perf_counter()
        step.compile(resolved.layout, batch_layout(program.run, step.batch_mesh))
        return time.perf_counter() - started

    run = program.run
    peak, source = peak_flops(mesh.devices.flatten().tolist(), run.model.dtype)
    return PlacedRun(
        program=program,
        mesh=mesh,
        step=step,
        tokens_per_step=run.train.batch_size * run.row_length,
        flops_per_token=flops_per_token(run.model, run.row_length, resolved.layout.params),
        peak_flops=peak,
        peak_source=source,
        compiling=in_background(compile_step),
    )


class LoopInputs(NamedTuple):
    state: TrainState  # step 0's, born sharded (microbatches do not change its layout)
    checkpoints: Checkpoints
    validation: data.ValidationSet | data.PairValidation  # the fixed batches every evaluation scores
    train: data.TrainWindows | data.TrainPairs | Rollouts  # what training batches are drawn from (`batch`)
    questions: list  # train.multiple_choice's, read once


def loop_inputs(resolved: ResolvedRun, placed: PlacedRun, workdir: Path) -> LoopInputs:
    """Stage 4: what the loop reads beside the step."""
    run, dataset = placed.run, resolved.dataset
    t = run.train
    train, validation = data.batch_sources(dataset, run)
    limit = t.multiple_choice_limit or None
    questions = multiple_choice.read_questions(t.multiple_choice, limit) if t.multiple_choice else []
    checkpoints = Checkpoints(workdir / "checkpoints", t.keep_checkpoints, scheduled=scheduled_steps(t))
    return LoopInputs(resolved.create(), checkpoints, validation, train, questions)


def write_run(workdir: Path, run: RunConfig, tokenizer) -> None:
    """Stage 5: what a reader of the workdir needs beside the checkpoints."""
    (workdir / "config.json").write_text(json.dumps(run.to_dict(), indent=2))
    save_tokenizer(tokenizer, workdir / "tokenizer.json")
