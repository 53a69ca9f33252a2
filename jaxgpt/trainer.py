"""The training loop: the stateful shell around the pure `train_step`.

`train_and_evaluate(config, workdir)` prepares data, builds or restores the state, and runs
the compiled step, fetching metrics from the device only at log, eval and checkpoint steps so
the accelerator is never stalled by the host.

A workdir holds everything of a run:
  config.json       the resolved configuration (every field, vocab_size filled in)
  tokenizer.json    the tokenizer, so sampling needs nothing else
  metrics.jsonl     one JSON object per logged step (jaxgpt.metrics; plot with jaxgpt.plot)
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
import dataclasses
import json
import math
import signal
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from tqdm import tqdm

from jaxgpt import data, runtime, sharding
from jaxgpt import workdir as run_dir
from jaxgpt.attention import kernel_fallback
from jaxgpt.autotune import fill_microbatches
from jaxgpt.checkpoint import Checkpoints
from jaxgpt.cli import warn
from jaxgpt.config import ARCHITECTURE_FIELDS, RESUMABLE_FIELDS, RunConfig, resolve, resume_conflicts
from jaxgpt.distributed import is_main_process
from jaxgpt.errors import UserError
from jaxgpt.hardware import peak_flops
from jaxgpt.metrics import MetricsLog, check_sinks_available
from jaxgpt.model import count_params, flops_per_token
from jaxgpt.optimizer import learning_rate_schedule
from jaxgpt.tokenizers import save_tokenizer
from jaxgpt.train_step import check_batch_fits_mesh, compiled_steps


def train_and_evaluate(
    config,
    workdir: str | Path,
    *,
    progress: bool = True,
    fresh: bool = False,
    stop_at: int | None = None,
    from_step: int | None = None,
) -> dict:
    """Train the model `config` describes (a ConfigDict, nested dict or RunConfig) in
    `workdir`, resuming from its checkpoints if it has any. Returns the last metrics record.

    fresh: start from step 0 even if the workdir holds a run; the old run is moved aside to
        `<workdir>.previous-<n>`, never deleted.
    stop_at: stop once this step is done, checkpointed as on SIGTERM (for time-boxed
        sessions); rerunning continues.
    from_step: resume from this checkpoint rather than the newest (after a divergence); the
        later checkpoints are moved aside to `<step>.abandoned`, never deleted.
    """
    runtime.enable_compilation_cache()  # as train.py does: a notebook's second run skips compilation
    workdir = Path(workdir)
    if workdir.exists() and not workdir.is_dir():
        raise UserError(f"workdir {workdir} is a file; pass --workdir a directory (new or from an earlier run)")
    notes: list[str] = []
    run = config if isinstance(config, RunConfig) else resolve(config, notes=notes)  # validate before slow work
    check_sinks_available(run.train.wandb_project)
    kernel_fallback(run.model.attention, jax.default_backend(), training=True)
    dataset = data.prepare(run.data, progress=progress)
    if not isinstance(config, RunConfig):
        run = resolve(config, vocab_size=dataset.tokenizer.vocab_size)
    data.check_long_enough(dataset, run.model.block_size)

    main = is_main_process()  # in a multi-process run, process 0 prints and writes the run's files
    say = tqdm.write if progress and main else (lambda message: None)
    for note in notes:
        say(f"note: {note}")
    if fresh and main and workdir.exists() and any(workdir.iterdir()):
        say(f"--fresh: moved the earlier run to {run_dir.move_aside(workdir)}")
    if fresh and jax.process_count() > 1:
        multihost_utils.sync_global_devices("jaxgpt: workdir moved aside")
    run_dir.make(workdir)
    with run_dir.locked(workdir) if main else contextlib.nullcontext():
        trainer = Trainer(run, dataset, workdir, say)
        with contextlib.closing(trainer.checkpoints):
            if from_step is not None:
                trainer.checkpoints.abandon_after(from_step)
            trainer.restore_or_start()  # refuses an incompatible run before anything is written
            if main:
                (workdir / "config.json").write_text(json.dumps(trainer.config.to_dict(), indent=2))
                save_tokenizer(dataset.tokenizer, workdir / "tokenizer.json")
            return trainer.run(progress=progress and main, stop_at=stop_at)


class Trainer:
    def __init__(self, run: RunConfig, dataset: data.Dataset, workdir: Path, say):
        self.mesh = sharding.make_mesh(run.mesh)
        run, note, self.compiled_step = fill_microbatches(run, self.mesh)
        if note:
            say(note)
        self.config, self.dataset, self.workdir, self.say = run, dataset, workdir, say
        check_batch_fits_mesh(run, self.mesh)
        self.schedule = learning_rate_schedule(run.train)
        self.state, self.train_step, self.eval_step = compiled_steps(run, self.mesh)
        self.checkpoints = Checkpoints(workdir / "checkpoints", run.train.keep_checkpoints)
        self.metrics_path = workdir / "metrics.jsonl"
        self.tokens_per_step = run.train.batch_size * run.model.block_size
        self.flops_per_token = flops_per_token(run.model, run.model.block_size)
        self.peak_flops, self.peak_source = peak_flops(self.mesh.devices.flatten().tolist())
        self.start_step, self.elapsed_before = 0, 0.0
        self.carried_losses: list[float] = []  # an unfinished logging interval's losses, from a checkpoint
        self.stop_reason: str | None = None

    # ------------------------------------------------------------------ resuming

    def restore_or_start(self) -> None:
        """Continue from the newest readable checkpoint, or start at step 0 if there is none."""
        self.checkpoints.check_room_for(self.state)  # before any work, not at the first save
        found = self.checkpoints.restore_latest_readable(self.state, check_record=self._check_same_run, warn=warn)
        if found is None:
            if self.config.train.init_from:
                self._start_from_pretrained(self.config.train.init_from)
            if is_main_process():
                self._keep_history_aside()
                self.metrics_path.write_text("")
            return
        step, self.state, record = found
        self._note_schedule_change(record, step)
        self.start_step = step
        self.elapsed_before = record.get("elapsed_sec", 0.0)
        self.carried_losses = record.get("pending_losses", [])
        self._truncate_metrics(step)
        self.say(f"resuming from step {step} of {self.config.train.steps}")

    def _note_schedule_change(self, record: dict, step: int) -> None:
        """Raising train.steps moves the end of the cosine: a finished run would continue at a
        higher learning rate than it ended with. Say so, and how to avoid it."""
        saved = dataclasses.replace(
            self.config.train,
            **{
                k: record["config"]["train"].get(k, 0) for k in ("steps", "decay_steps", "warmup_steps", "lr", "min_lr")
            },
        )
        before, now = float(learning_rate_schedule(saved)(step)), float(self.schedule(step))
        if not math.isclose(before, now, rel_tol=1e-3):
            self.say(
                f"note: the learning rate at step {step} is now {now:.3g} (the run was at {before:.3g}): the new "
                f"train settings move the schedule. To continue a finished decay at min_lr instead, add "
                f"--config.train.decay_steps={saved.decay_steps or saved.steps}"
            )

    def _start_from_pretrained(self, source: str) -> None:
        """Replace the random init by Hugging Face weights (the optimizer's zero moments do
        not depend on the parameters' values)."""
        from jaxgpt.hf import load_pretrained
        from jaxgpt.model import stack_blocks

        pretrained, params, _ = load_pretrained(source)
        ours = self.config.model
        differ = [
            f"model.{f}={getattr(ours, f)!r} but the checkpoint has {getattr(pretrained, f)!r}"
            for f in ARCHITECTURE_FIELDS
            if getattr(ours, f) != getattr(pretrained, f)
        ]
        if differ:
            raise UserError(f"train.init_from={source!r} does not fit this config: {'; '.join(differ)}")
        if ours.scan_layers:
            params = stack_blocks(params, ours.n_layer)
        shardings = jax.tree.map(lambda a: a.sharding, self.state.params)
        self.state = self.state.replace(params=jax.device_put(params, shardings))
        self.say(f"initialised from {source}")

    def _check_same_run(self, record: dict) -> None:
        conflicts = resume_conflicts(record["config"], self.config.to_dict())
        if record["tokenizer"] != self.dataset.tokenizer.to_dict():
            conflicts.append("the tokenizer's vocabulary")
        if conflicts:
            raise UserError(
                f"cannot resume {self.workdir}: its checkpoints come from another run ({'; '.join(conflicts)}). "
                f"Use the original config, or start afresh with --fresh (the old run is kept aside). "
                f"A resume may change only {', '.join(sorted(RESUMABLE_FIELDS))}"
            )

    def _keep_history_aside(self) -> None:
        """Starting at step 0 in a workdir that already logged a run (its checkpoints were
        deleted, or it crashed before its first one): move that run's metrics aside rather
        than overwrite them."""
        logged = [p for p in (self.metrics_path, self.workdir / "tensorboard") if p.exists()]
        if not any(p.is_dir() or p.stat().st_size for p in logged):
            return
        aside = run_dir.unused_sibling(self.workdir / "history", "before-restart")
        aside.mkdir()
        for path in logged:
            path.rename(aside / path.name)
        warn(
            f"{self.workdir} has metrics but no checkpoint to resume from; starting at step 0, the old metrics "
            f"are kept in {aside}"
        )

    def _truncate_metrics(self, step: int) -> None:
        """Drop lines past the restored step: the resumed run writes them again."""
        if not is_main_process() or not self.metrics_path.exists():
            return
        lines = self.metrics_path.read_text().splitlines()
        kept = [line for line in lines if line.strip() and json.loads(line)["step"] <= step]
        tmp = self.metrics_path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(self.metrics_path)

    def save(self, step: int, elapsed: float, pending_losses: list[float]) -> None:
        record = {
            "step": step,
            "elapsed_sec": elapsed,
            "pending_losses": pending_losses,
            "config": self.config.to_dict(),
            "tokenizer": self.dataset.tokenizer.to_dict(),
        }
        self.checkpoints.save(step, self.state, record)

    # ------------------------------------------------------------------ stopping

    @contextlib.contextmanager
    def _stop_on_signals(self):
        """SIGTERM/SIGINT ask the loop to stop after the current step; a second SIGINT
        interrupts at once. Only the main thread may install handlers (not so in a notebook
        cell run from a thread): elsewhere signals keep their defaults."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def request_stop(signum, _frame):
            self.stop_reason = signal.Signals(signum).name
            self.say(f"{self.stop_reason}: finishing this step and writing a checkpoint (Ctrl-C again to abort)")
            signal.signal(signal.SIGINT, signal.default_int_handler)

        previous = {s: signal.signal(s, request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    # ------------------------------------------------------------------ the loop

    def batch(self, step: int, tokens=None, stream: int = data.TRAIN_STREAM) -> jax.Array:
        """Batch `step` of a stream as one array sharded over the mesh; this process reads
        only its own rows."""
        t, tokens = self.config.train, self.dataset.train if tokens is None else tokens

        def rows(start, stop):
            return data.batch_at(
                tokens, self.config.model.block_size, t.batch_size, t.seed, stream, step, slice(start, stop)
            )

        return sharding.global_batch(self.mesh, rows, t.batch_size)

    def evaluate(self) -> dict:
        out = {}
        for name, tokens, stream in (
            ("val_loss", self.dataset.val, data.EVAL_VAL_STREAM),
            ("eval_train_loss", self.dataset.train, data.EVAL_TRAIN_STREAM),
        ):
            batches = (self.batch(i, tokens, stream) for i in range(self.config.train.eval_batches))
            losses = [self.eval_step(self.state.params, batch) for batch in batches]
            out[name] = float(np.mean(jax.device_get(losses)))
        return out

    def run(self, progress: bool = True, stop_at: int | None = None) -> dict:
        """Train from the restored step to train.steps (or stop_at, or a signal). The caller
        closes self.checkpoints, which waits for the last asynchronous save."""
        t = self.config.train
        start = self.start_step
        self.say(self._describe())
        if start >= t.steps:
            self.say(f"already trained to step {start}; raise train.steps to continue")
            return {"step": start}

        compile_start = time.perf_counter()
        first = self.batch(start)
        step_fn = self.compiled_step or self.train_step.lower(self.state, first).compile()
        self.say(f"compiled train_step in {time.perf_counter() - compile_start:.1f} s")

        bar = tqdm(total=t.steps, initial=start, desc="train", unit="step", disable=not progress)
        batches = data.prefetch(self.batch, range(start + 1, t.steps))
        pending: list[dict] = []  # device-side metrics since the last fetch
        losses = list(self.carried_losses)  # host-side losses of the current logging interval
        last: dict = {"step": start}
        clock = interval_start = time.perf_counter()
        interval_steps = 0
        log = MetricsLog(
            self.workdir,
            enabled=is_main_process(),
            tensorboard=t.tensorboard,
            wandb_project=t.wandb_project,
            run_config=self.config.to_dict(),
            resume_step=start,
        )
        with self._stop_on_signals(), log, contextlib.closing(bar):
            for step in range(start, t.steps):
                self.state, metrics = step_fn(self.state, first if step == start else next(batches))
                pending.append(metrics)
                interval_steps += 1
                done = step + 1
                bar.update(1)
                is_last = done == t.steps
                stopping = self.stop_reason is not None or done == stop_at
                logs = done % t.log_every == 0 or is_last
                evals = done % t.eval_every == 0 or is_last
                saves = done % t.checkpoint_every == 0 or is_last or stopping
                if not (logs or evals or saves):
                    continue
                fetched = jax.device_get(pending)  # the only host sync in the loop
                pending = []
                self._check_finite(fetched, done - len(fetched) + 1)
                self.checkpoints.check_for_errors()  # a failed save is reported within one interval
                losses += [float(m["loss"]) for m in fetched]
                now = time.perf_counter()
                elapsed = self.elapsed_before + now - clock
                if logs or evals:
                    tokens_per_sec = self.tokens_per_step * interval_steps / (now - interval_start)
                    last = {
                        "step": done,
                        "train_loss": float(np.mean(losses)),
                        "lr": float(self.schedule(step)),
                        "grad_norm": float(fetched[-1]["grad_norm"]),
                        "tokens_per_sec": tokens_per_sec,
                        "tokens_per_sec_per_device": tokens_per_sec / self.mesh.size,
                        "mfu": tokens_per_sec * self.flops_per_token / self.peak_flops,
                        "elapsed_sec": elapsed,
                    }
                    if evals:
                        last |= self.evaluate()
                        self.say(f"step {done}: train {last['eval_train_loss']:.4f}, val {last['val_loss']:.4f}")
                    log.write(last)
                    bar.set_postfix(loss=f"{last['train_loss']:.3f}", tok_s=f"{tokens_per_sec:,.0f}")
                    losses = []
                if saves:
                    self.save(done, elapsed, losses)
                if stopping and not is_last:
                    self.checkpoints.wait()
                    self.say(
                        f"stopped at step {done} ({self.stop_reason or f'stop_at={stop_at}'}); checkpoint written. "
                        "Rerun the same command to resume"
                    )
                    return last | {"step": done, "stopped": True}
                interval_start, interval_steps = time.perf_counter(), 0  # eval/checkpoint time is not training
        self.checkpoints.wait()
        self.say(
            f"done: step {last['step']}, val loss {last.get('val_loss', float('nan')):.4f}, "
            f"{last['elapsed_sec']:.0f} s, {last['tokens_per_sec']:,.0f} tokens/s, MFU {last['mfu']:.1%}; "
            f"checkpoints in {self.checkpoints.directory}"
        )
        return last

    def _describe(self) -> str:
        mesh = ", ".join(f"{axis}={size}" for axis, size in self.mesh.shape.items())
        return (
            f"model: {count_params(self.state.params):,} parameters, {self.tokens_per_step:,} tokens/step; "
            f"mesh {mesh} over {self.mesh.size} x {jax.devices()[0].device_kind}; per device: params "
            f"{sharding.bytes_per_device(self.state.params) / 2**20:,.1f} MiB, optimizer state "
            f"{sharding.bytes_per_device(self.state.opt_state) / 2**20:,.1f} MiB; peak {self.peak_flops / 1e9:,.0f} "
            f"GFLOP/s ({self.peak_source})"
        )

    def _check_finite(self, fetched: list[dict], first_step: int) -> None:
        """Stop at the first non-finite loss or gradient norm. Checkpoints are written only
        after this check, and only of a state whose parameters are all finite, so the newest
        checkpoint is always one to continue from."""
        for offset, metrics in enumerate(fetched):
            bad = {k: float(metrics[k]) for k in ("loss", "grad_norm") if not math.isfinite(float(metrics[k]))}
            if bad:
                self._diverged(first_step + offset, ", ".join(f"{k} became {v}" for k, v in bad.items()))
        if not bool(all_finite(self.state.params)):
            self._diverged(first_step + len(fetched) - 1, "parameters became non-finite")

    def _diverged(self, step: int, what: str) -> None:
        self.checkpoints.wait()
        kept = self.checkpoints.steps()
        lower = f"--config.train.lr={self.config.train.lr / 10:g}"
        if not kept:
            advice = f"no checkpoint was written before it; start again with a lower learning rate ({lower} --fresh)"
        else:
            advice = (
                f"checkpoints {', '.join(map(str, kept))} are kept, all finite. Rerun with a lower learning rate "
                f"({lower}; a resume may change it) to continue from step {kept[-1]}, adding --from_step {kept[0]} "
                "to go back further (later checkpoints are moved aside, not deleted); or start again with --fresh"
            )
        raise UserError(f"training diverged at step {step}: {what}; {advice}")


@jax.jit
def all_finite(tree) -> jax.Array:
    return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in jax.tree.leaves(tree)]))
