"""The training loop: the stateful shell around the pure `train_step`.

`train_and_evaluate(config, workdir)` runs the stages before the first step (jaxgpt/job/setup.py:
the run resolved and checked, its data prepared, the workdir opened, the step chosen and the
state placed), restores the state from the workdir's checkpoints if it has any, and runs the
compiled step, fetching metrics from the device only at log, eval and checkpoint steps so the
accelerator is never stalled by the host.

A workdir holds everything of a run:
  config.json       the resolved configuration (every field, vocab_size filled in)
  tokenizer.json    the tokenizer, whole (its vocabulary file too), so sampling needs nothing else
  metrics.jsonl     one JSON object per logged step (jaxgpt.job.metrics; plot with jaxgpt.commands.plot)
  tensorboard/      the same metrics as TensorBoard event files (train.tensorboard)
  checkpoints/      orbax checkpoints, each with the state and a record of the run

Resuming is exact. Batches are a pure function of (seed, step), so the step is the whole data
position; the dropout key is in the state; the per-step losses of an unfinished logging
interval travel in the checkpoint's record, so metrics.jsonl comes out the same as an
uninterrupted run's. SIGTERM or Ctrl-C finishes the current step, checkpoints, and returns; a
second Ctrl-C stops at once.
"""

from __future__ import annotations

import contextlib
import math
import time
from functools import partial
from pathlib import Path
from typing import NamedTuple

import jax
import numpy as np
from tqdm import tqdm

from jaxgpt import data
from jaxgpt.errors import warn
from jaxgpt.hardware import runtime
from jaxgpt.hardware.distributed import is_main_process
from jaxgpt.hardware.mesh_step import in_background
from jaxgpt.job import setup
from jaxgpt.job.metrics import (
    MetricsLog,
    describe_mfu,
    model_flops_utilisation,
    router_record,
    training_record,
)
from jaxgpt.job.resume import checkpoint_record, restore_or_start
from jaxgpt.job.stopping import RunawayWatch, StopRequests, check_finite
from jaxgpt.lab import multiple_choice
from jaxgpt.lab.watch import Watch
from jaxgpt.training.train_step import per_layer


def describe_val(record: dict) -> str:
    """The validation loss as what it is: with bits per byte for a next-token loss (and the
    past-only loss of a model trained without the causal mask), with the accuracy on the hidden
    tokens for the masked objective, the share classified right for a classifier; "nan" before
    the first evaluation."""
    loss = f"{record.get('val_loss', float('nan')):.4f}"
    if "val_confusion" in record:
        return f"{loss} (classification loss; {record['val_accuracy']:.1%} of held-out examples classified right)"
    if "val_accuracy" in record:
        return f"{loss} (masked-token loss; {record['val_accuracy']:.1%} of hidden tokens right)"
    past_only = f", past-only {record['val_loss_past_only']:.4f}" if "val_loss_past_only" in record else ""
    if "val_exact_match" in record:
        past_only += f", {record['val_exact_match']:.1%} of answers exactly right"
    return f"{loss} ({record.get('val_bpb', float('nan')):.4f} bits/byte){past_only}"


def train_and_evaluate(
    config,
    workdir: str | Path,
    *,
    progress: bool = True,
    fresh: bool = False,
    stop_at: int | None = None,
    from_step: int | None = None,
    verify_data: bool = False,
    overrides: tuple[str, ...] = (),
) -> dict:
    """Train the model `config` describes (a ConfigDict, nested dict or RunConfig) in
    `workdir`, resuming from its checkpoints if it has any. Returns the last metrics record.

    fresh: start from step 0 even if the workdir holds a run; the old run is moved aside to
        `<workdir>.previous-<n>`, never deleted.
    stop_at: stop once this step is done, checkpointed as on SIGTERM (for time-boxed
        sessions); rerunning continues.
    from_step: resume from this checkpoint rather than the newest (after a divergence); the
        later checkpoints are moved aside to `<step>.abandoned`, never deleted.
    verify_data: check the prepared token file's checksum even when it is large
        (`data.prepare` always checks its size, and the checksum of small files).
    overrides: the config keys set on purpose ("model.rope_theta"; train.py passes its
        command line's --config.X): a run starting from weights (train.init_from) takes their
        model, and only these may move it (jaxgpt/job/pretrained.py).
    """
    runtime.enable_compilation_cache()  # as train.py does: a notebook's second run skips compilation
    setup.check_stops(stop_at, from_step)
    workdir = Path(workdir)
    resolved = setup.resolve_run(
        config, workdir, progress=progress, verify_data=verify_data, overrides=overrides, fresh=fresh
    )
    main = is_main_process()  # in a multi-process run, process 0 prints and writes the run's files
    say = tqdm.write if progress and main else (lambda message: None)
    for note in resolved.notes:
        say(f"note: {note}")
    with setup.opened(workdir, fresh=fresh, main=main, say=say):
        trainer = Trainer.on_this_machine(resolved, workdir, say)
        # on every path: the last asynchronous save, and evaluation's programs running beside
        with contextlib.closing(trainer), contextlib.closing(trainer.checkpoints):
            if from_step is not None:
                trainer.checkpoints.abandon_after(from_step)
            keep_start = bool(trainer.config.train.rl)  # the KL's reference: step 0's model
            start = restore_or_start(  # refuses an incompatible run before anything is written
                trainer.checkpoints, trainer.state, trainer.config, resolved.dataset.tokenizer, workdir, keep_start,
                main=main, say=say, warn=warn,
            )  # fmt: skip
            if keep_start:
                trainer.train_batches.reference = start.params_at_start
            every = trainer.config.train.rl.updates if trainer.config.train.rl else 1
            setup.check_stops(stop_at, from_step, resumed_at=start.step, every=every)
            if main:
                setup.write_run(workdir, trainer.config, resolved.dataset.tokenizer)
            return trainer.train(start, progress=progress and main, stop_at=stop_at)


COUNTS = ("exact_matches", "examples", "confusion")  # added over the batches, not averaged


def _validation_batch(validation, index: int, mesh) -> dict:
    return validation.batch(mesh, index)


def mean_losses(batches: list[dict]) -> dict:
    """Each measurement's mean over the batches: over every token scored, where batches score
    different numbers of tokens ("scored": the masked objective's hidden ones, the answers of
    text pairs), else over the batches; counts (COUNTS) summed. A nested measurement (a mixture
    of experts' router statistics, per layer) is averaged leaf by leaf."""
    counts = {
        key: np.sum([np.asarray(b[key], np.float64) for b in batches], axis=0) for key in COUNTS if key in batches[0]
    }
    counts = {key: float(value) if value.ndim == 0 else value for key, value in counts.items()}
    means = [key for key in batches[0] if key not in COUNTS and key != "scored"]
    scored = np.array([float(b["scored"]) for b in batches]) if "scored" in batches[0] else None

    def mean(*values):
        averaged = np.average(np.stack([np.asarray(v, np.float64) for v in values]), axis=0, weights=scored)
        return float(averaged) if averaged.ndim == 0 else averaged

    return {key: jax.tree.map(mean, *[b[key] for b in batches]) for key in means} | counts


class Due(NamedTuple):
    """What is due after a step: a metrics record, an evaluation, a checkpoint, the questions."""

    logs: bool
    evals: bool
    saves: bool
    asks: bool


class Interval:
    """The loop's bookkeeping between two host syncs: the steps' metrics still on the device,
    the training losses of the logging interval (carried over a resume in the checkpoint's
    record), and the clocks that keep evaluation and checkpointing out of training time."""

    def __init__(self, start):
        self.pending: list[dict] = []  # device-side metrics since the last fetch
        self.losses = list(start.carried_losses)  # host-side losses of the current logging interval
        self.last: dict = {"step": start.step}  # the latest metrics record
        self.elapsed_before = start.elapsed_before
        self.clock = self.started = time.perf_counter()
        self.training_seconds = 0.0  # this session's, evaluation and checkpointing left out

    def close(self) -> tuple[float, float]:
        """(seconds of training since the interval started, the run's elapsed seconds)."""
        now = time.perf_counter()
        self.training_seconds += now - self.started
        return now - self.started, self.elapsed_before + now - self.clock

    def restart(self) -> None:
        self.started = time.perf_counter()


class Trainer:
    """A run's compiled steps, data, mesh and checkpoints, and the loop that uses them."""

    def __init__(self, dataset, placed: setup.PlacedRun, inputs: setup.LoopInputs, workdir: Path, say):
        self.config, self.dataset, self.workdir, self.say, self.placed = placed.run, dataset, workdir, say, placed
        self.mesh, self.step = placed.mesh, placed.step
        # the optimizer's own: the learning rate logged is the one applied; compiled as one program,
        # where run op by op its few operations would each compile (a quarter second at start)
        self.schedule = jax.jit(placed.program.schedule)
        # the state is held here alone (`inputs` is not kept), so a restored state replaces step 0's in
        # memory rather than beside it
        self.state, self.checkpoints, self.validation, self.train_batches, self.questions = inputs
        run = placed.run
        self.runaway = RunawayWatch(run.model.outputs, self.checkpoints, warn, run.train.warmup_steps)
        # train.lab's probes, made once from the seed and the validation split: a resume measures the same
        self.lab = Watch(run.model, run.train.lab, run.train.seed, self.validation.tokens) if run.train.lab else None
        # evaluation's programs compile beside the step's (one process only: a multi-host
        # evaluation's collectives must run in the same order in every process)
        self._warming_up = in_background(self._warm_up) if jax.process_count() == 1 else None
        self._answers = None  # train.rl's batch of answers, used for train.rl.updates steps

    def _warm_up(self) -> None:
        """Compile evaluation's programs (and train.lab's measures') by running them once on step
        0's parameters, one after the other on one thread. Programs whose collectives span the
        mesh must never run from two threads at once on XLA:CPU: each device's part holds a
        thread of one pool while it waits for the others, and enough of them at once starve the
        pool, every rendezvous waits, and XLA aborts the process after 40 s (seen in the test
        suite, 2026-12-05; five threads launching such programs abort a 2-vCPU machine within
        seconds). So the loop runs nothing of its own until this is done (`_programs_ready`)."""
        self._score_a_batch_a_device(self.state.params)
        if self.lab is not None:
            self.lab.measure(self.state.params)

    def _programs_ready(self) -> None:
        """Wait for `_warm_up`; raises what it raised."""
        if self._warming_up is not None:
            self._warming_up.result()

    def close(self) -> None:
        """Wait for `_warm_up`, on every path: a run that ends before its first step (already
        trained, refused, a reward that raised) would otherwise leave it running evaluation's
        programs into whatever the process does next. What it raised was raised where its result
        was asked for, or matters no more."""
        if self._warming_up is not None:
            self._warming_up.exception()

    @classmethod
    def on_this_machine(cls, resolved: setup.ResolvedRun, workdir: Path, say) -> Trainer:
        """The stages between an opened workdir and the loop: the run placed on this machine's
        devices, then what its loop reads."""
        placed = setup.place_run(resolved, say)
        return cls(resolved.dataset, placed, setup.loop_inputs(resolved, placed, workdir), workdir, say)

    def train(self, start, progress: bool = True, stop_at: int | None = None) -> dict:
        """Train from `start` (a resume.StartingPoint) to train.steps, or to stop_at, or until
        a signal. Metrics stay on the device until a log, eval or checkpoint step needs them,
        so the host never stalls the accelerator in between (on CPU cores the step itself lets
        the host run at most 20 steps ahead: core_parallel.WAIT_EVERY says why)."""
        t = self.config.train
        self.state = start.state
        self.say(self.placed.describe(self.state))
        self.say(self.validation.describe())
        if start.step >= t.steps:
            self.say(f"already trained to step {start.step}; raise train.steps to continue")
            return {"step": start.step}
        self._programs_ready()  # before a rollout's sampling runs programs on the mesh
        first_batch = self.batch(start.step)
        step_fn = self._compile(first_batch)
        later = range(start.step + 1, t.steps)
        # a rollout reads the parameters of the step before it: drawn as the loop reaches it
        batches = map(self.batch, later) if t.rl else data.prefetch(self.batch, later)
        interval = Interval(start)
        # disable=None: no bar where stderr is not a terminal (a log file would get one endless
        # line of redrawn bars); each logged step is then a line of its own instead
        bar = tqdm(total=t.steps, initial=start.step, desc="train", unit="step", disable=None if progress else True)
        with StopRequests(self.say) as stops, self._metrics_log(start.step) as log, contextlib.closing(bar):
            for step in range(start.step, t.steps):
                self.state, metrics = step_fn(self.state, first_batch if step == start.step else next(batches))
                interval.pending.append(metrics)
                bar.update(1)
                done = step + 1
                stopping = (stops.reason is not None or done == stop_at) and self._between_batches(done)
                if due := self._due(done, stopping):
                    interval.last = self._boundary(done, due, interval, log, bar, lines=progress and bar.disable)
                if stopping and done < t.steps:
                    self.checkpoints.wait()
                    why = stops.reason or f"stop_at={stop_at}"
                    self.say(f"stopped at step {done} ({why}); checkpoint written. Rerun the same command to resume")
                    return interval.last | {"step": done, "stopped": why}
        self.checkpoints.wait()
        self.say(self._summary(interval, t.steps - start.step))
        return interval.last

    def _between_batches(self, done: int) -> bool:
        """Whether a run may stop after step `done`: anywhere, but where train.rl.updates takes
        several steps on a batch of answers, only after its last (a run resumes where a batch is
        sampled; a stop asked for within one waits for its end)."""
        rl = self.config.train.rl
        return not rl or done % rl.updates == 0

    def _due(self, done: int, stopping: bool) -> Due | None:
        """What the host must do after step `done`, or None when nothing is due."""
        t = self.config.train
        due = Due(
            logs=done % t.log_every == 0 or done == t.steps,
            evals=done % t.eval_every == 0 or done == t.steps,
            saves=done % t.checkpoint_every == 0 or done == t.steps or stopping or done in self.checkpoints.scheduled,
            asks=bool(self.questions) and (done == t.steps or done % (t.multiple_choice_every or t.steps) == 0),
        )
        return due if any(due) else None

    def _boundary(self, done: int, due: Due, interval: Interval, log: MetricsLog, bar, lines: bool) -> dict:
        """Everything the host does after step `done`: fetch the interval's metrics (the loop's
        only host sync) and check them, then log, evaluate, ask the questions and checkpoint,
        as each is due. Returns the latest metrics record."""
        t = self.config.train
        logs, evals, saves, asks = due
        fetched, interval.pending = jax.device_get(interval.pending), []
        check_finite(fetched, done - len(fetched) + 1, self.state.params, self.checkpoints, t.lr)
        self.checkpoints.check_for_errors()  # a failed save is reported within one interval
        # a large corpus is hashed while training: damage stops the run, and the last
        # checkpoint waits for the whole check
        if problem := self.dataset.damage(wait=saves and done == t.steps):
            raise data.stop_for_damage(self.dataset, problem, done)
        interval.losses += [float(m["loss"]) for m in fetched]
        seconds, elapsed = interval.close()
        last = interval.last
        if logs or evals or asks:
            last = self._record(done, interval.losses, fetched, seconds, elapsed)
            if evals:
                last |= self.evaluate()
                self.say(f"step {done}: train {last['eval_train_loss']:.4f}, val {describe_val(last)}")
            if asks:
                last |= self.ask_questions(done)
            log.write(last)
            bar.set_postfix(loss=f"{last['train_loss']:.3f}", tok_s=f"{last['tokens_per_sec']:,.0f}")
            if lines:
                self.say(
                    f"step {done}/{t.steps}: loss {last['train_loss']:.4f}, "
                    f"{last['tokens_per_sec']:,.0f} tokens/s, {last['elapsed_sec']:.0f} s"
                )
            interval.losses = []
        if evals:  # logged, and before the save: a run that has run away keeps its best checkpoint
            self.runaway.evaluated(done, last["val_loss"], lr=t.lr)
        if saves:
            record = checkpoint_record(done, elapsed, interval.losses, self.config, self.dataset.tokenizer)
            self.checkpoints.save(done, self.state, record, val_loss=last["val_loss"] if evals else None)
        interval.restart()  # eval/checkpoint time is not training time
        return last

    def _summary(self, interval: Interval, steps: int) -> str:
        """The closing line: where the run ended, and its average speed over the steps trained here."""
        last = interval.last
        tokens_per_sec = steps * self.placed.tokens_per_step / interval.training_seconds
        mfu = model_flops_utilisation(tokens_per_sec * self.placed.flops_per_token, self.placed.peak_flops)
        return (
            f"done: step {last['step']}, val loss {describe_val(last)}, {last['elapsed_sec']:.0f} s; "
            f"averaged over the {steps} steps trained here: {tokens_per_sec:,.0f} tokens/s, "
            f"{describe_mfu(mfu)}; checkpoints in {self.checkpoints.directory}"
        )

    def batch(self, step: int) -> dict:
        """Training batch `step` (jaxgpt/training/batch.py) sharded over the devices the train step splits
        it over (the mesh's, or the CPU cores'): with train.rl, answers the current parameters sample."""
        if rl := self.config.train.rl:  # sampled at the first of its train.rl.updates steps, then kept
            if step % rl.updates == 0 or self._answers is None:
                self._answers = self.train_batches.rollout(self.state.params, step, self.step.batch_mesh)
            return self._answers
        return self.train_batches.batch(self.config, self.step.batch_mesh, step, data.TRAIN_STREAM)

    def evaluate(self) -> dict:
        """The loss over the fixed validation set, with its bits per byte (the loss in nats per
        token x tokens / bytes / ln 2: comparable across tokenizers) and perplexity; and the
        mean loss on train.eval_batches training batches (each the same every time)."""
        v = self.validation
        losses = partial(self.step.eval_losses, self.state.params)
        val = losses(partial(_validation_batch, v), v.batches)
        train = losses(
            lambda i, mesh: self.train_batches.batch(self.config, mesh, i, data.EVAL_TRAIN_STREAM),
            self.config.train.eval_batches,
        )
        val, train = mean_losses(jax.device_get(val)), mean_losses(jax.device_get(train))
        record = self.placed.program.objective.record(val, train, v.target_tokens / v.target_bytes / math.log(2))
        return record | (self.lab.measure(self.state.params) if self.lab else {})

    def ask_questions(self, step: int) -> dict:
        """Both accuracies on train.multiple_choice's questions (jaxgpt/lab/multiple_choice.py), said."""
        score = multiple_choice.score(self.config.model, self.state.params, self.dataset.tokenizer, self.questions)
        self.say(
            f"step {step}: multiple choice accuracy {score.accuracy:.4f}, normalised {score.normalised_accuracy:.4f} "
            f"({self.config.train.multiple_choice})"
        )
        return {"multiple_choice_accuracy": score.accuracy, "multiple_choice_accuracy_norm": score.normalised_accuracy}

    def _score_a_batch_a_device(self, params) -> None:
        """Compiles evaluate's programs (each core's, or the mesh's) by scoring one validation
        batch a device with `params` (step 0's) and dropping the losses."""
        v = self.validation
        losses = self.step.eval_losses(params, partial(_validation_batch, v), min(v.batches, len(self.step.devices)))
        jax.block_until_ready(losses)

    def _compile(self, batch):
        """The train step, compiled (setup.place_run set it compiling from the state's and batch's
        shapes; autotuning may have compiled it before), and evaluation's programs (`_warm_up`);
        before the first step, which donates step 0's parameters."""
        self._programs_ready()
        seconds = self.placed.compiling.result()  # raises what compiling raised
        self.say(f"compiled {self.step.what} in {seconds:.1f} s")
        return self.step.compile(self.state, batch)  # compiled: the step itself

    def _record(self, done: int, losses: list[float], fetched: list[dict], seconds: float, elapsed: float) -> dict:
        record = training_record(
            step=done,
            losses=losses,
            lr=float(self.schedule(done - 1)),
            grad_norm=float(fetched[-1]["grad_norm"]),
            tokens=self.placed.tokens_per_step * len(fetched),
            seconds=seconds,
            devices=self.mesh.size,
            flops_per_token=self.placed.flops_per_token,
            peak_flops=self.placed.peak_flops,
            elapsed=elapsed,
        )
        if "layer_grad_norms" in fetched[-1]:  # train.log_layer_grad_norms
            record |= {f"grad_norm/{name}": v for name, v in per_layer(fetched[-1]["layer_grad_norms"]).items()}
        # the interval's means of multi-token prediction's loss, train.rl.kl's divergence from the
        # starting model, and the share of tokens train.rl.updates' clip held
        for name in ("ahead_loss", "kl", "clipped"):
            if name in fetched[-1]:
                record[f"train_{name}"] = float(np.mean([float(step[name]) for step in fetched]))
        if self.config.train.rl:  # the interval's rollouts, measured on the host
            said, self.train_batches.said = self.train_batches.said, []
            record |= {f"rl_{name}": float(np.mean([s[name] for s in said])) for name in said[0]} if said else {}
        if "router" in fetched[-1]:  # a mixture of experts
            record |= router_record([step["router"] for step in fetched], self.config.model.moe_layers)
        return record

    def _metrics_log(self, start_step: int) -> MetricsLog:
        t = self.config.train
        return MetricsLog(
            self.workdir,
            enabled=is_main_process(),
            tensorboard=t.tensorboard,
            wandb_project=t.wandb_project,
            run_config=self.config.to_dict(),
            resume_step=start_step,
        )
