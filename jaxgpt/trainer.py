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
import json
import math
import signal
import sys
import threading
import time
from functools import partial
from pathlib import Path

import jax
import numpy as np
from jax.experimental import multihost_utils
from tqdm import tqdm

from jaxgpt import data, sharding
from jaxgpt.checkpoint import Checkpoints
from jaxgpt.config import RESUMABLE_FIELDS, RunConfig, resolve, resume_conflicts
from jaxgpt.distributed import is_main_process
from jaxgpt.errors import UserError
from jaxgpt.hardware import peak_flops
from jaxgpt.metrics import MetricsLog, check_sinks_available
from jaxgpt.model import GPT, count_params, flops_per_token
from jaxgpt.optimizer import learning_rate_schedule, make_optimizer
from jaxgpt.tokenizers import save_tokenizer
from jaxgpt.train_step import create_train_state, eval_step, train_step


def train_and_evaluate(
    config, workdir: str | Path, *, progress: bool = True, fresh: bool = False, stop_at: int | None = None
) -> dict:
    """Train the model `config` describes (a ConfigDict, nested dict or RunConfig) in
    `workdir`, resuming from its checkpoints if it has any. Returns the last metrics record.

    fresh: start from step 0 even if the workdir holds a run; the old run is moved aside to
        `<workdir>.previous-<n>`, never deleted.
    stop_at: stop once this step is done, checkpointed as on SIGTERM (for time-boxed
        sessions); rerunning continues.
    """
    workdir = Path(workdir)
    if workdir.exists() and not workdir.is_dir():
        raise UserError(f"workdir {workdir} is a file; pass --workdir a directory (new or from an earlier run)")
    run = config if isinstance(config, RunConfig) else resolve(config)  # validate before slow work
    check_sinks_available(run.train.wandb_project)
    if run.model.attention == "flash_tpu" and jax.default_backend() != "tpu":
        raise UserError(
            f"model.attention='flash_tpu' is a TPU kernel and this run is on {jax.default_backend()}; "
            "set --config.model.attention=xla (or dot_product)"
        )
    dataset = data.prepare(run.data, progress=progress)
    if not isinstance(config, RunConfig):
        run = resolve(config, vocab_size=dataset.tokenizer.vocab_size)
    data.check_long_enough(dataset, run.model.block_size)

    main = is_main_process()  # in a multi-process run, process 0 prints and writes the run's files
    say = tqdm.write if progress and main else (lambda message: None)
    if fresh and main and workdir.exists() and any(workdir.iterdir()):
        aside = next(
            p for n in range(1, 10_000) if not (p := workdir.with_name(f"{workdir.name}.previous-{n}")).exists()
        )
        workdir.rename(aside)
        say(f"--fresh: moved the earlier run to {aside}")
    if fresh and jax.process_count() > 1:
        multihost_utils.sync_global_devices("jaxgpt: workdir moved aside")
    workdir.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(run, dataset, workdir, say)
    trainer.restore_or_start()  # refuses an incompatible run before anything is written
    if main:
        (workdir / "config.json").write_text(json.dumps(run.to_dict(), indent=2))
        save_tokenizer(dataset.tokenizer, workdir / "tokenizer.json")
    return trainer.run(progress=progress and main, stop_at=stop_at)


class Trainer:
    def __init__(self, run: RunConfig, dataset: data.Dataset, workdir: Path, say):
        self.config, self.dataset, self.workdir, self.say = run, dataset, workdir, say
        self.mesh = sharding.make_mesh(run.mesh)
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
        found = self.checkpoints.restore_latest_readable(self.state, check_record=self._check_same_run, warn=_warn)
        if found is None:
            if self.config.train.init_from:
                self._start_from_pretrained(self.config.train.init_from)
            if is_main_process():
                self.metrics_path.write_text("")
            return
        step, self.state, record = found
        self.start_step = step
        self.elapsed_before = record.get("elapsed_sec", 0.0)
        self.carried_losses = record.get("pending_losses", [])
        self._truncate_metrics(step)
        self.say(f"resuming from step {step} of {self.config.train.steps}")

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
        t = self.config.train
        start = self.start_step
        mesh = ", ".join(f"{axis}={size}" for axis, size in self.mesh.shape.items())
        self.say(
            f"model: {count_params(self.state.params):,} parameters, {self.tokens_per_step:,} tokens/step; "
            f"mesh {mesh} over {self.mesh.size} x {jax.devices()[0].device_kind}; per device: params "
            f"{sharding.bytes_per_device(self.state.params) / 2**20:,.1f} MiB, optimizer state "
            f"{sharding.bytes_per_device(self.state.opt_state) / 2**20:,.1f} MiB; peak {self.peak_flops / 1e9:,.0f} "
            f"GFLOP/s ({self.peak_source})"
        )
        if start >= t.steps:
            self.say(f"already trained to step {start}; raise train.steps to continue")
            self.checkpoints.close()
            return {"step": start}

        compile_start = time.perf_counter()
        first = self.batch(start)
        step_fn = self.train_step.lower(self.state, first).compile()
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
        with self._stop_on_signals(), log:
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
                new_losses = [float(m["loss"]) for m in fetched]
                self._check_finite(new_losses, done - len(new_losses) + 1, bar)
                losses += new_losses
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
                    bar.close()
                    self.checkpoints.wait()
                    self.say(
                        f"stopped at step {done} ({self.stop_reason or f'stop_at={stop_at}'}); checkpoint written. "
                        "Rerun the same command to resume"
                    )
                    self.checkpoints.close()
                    return last | {"step": done, "stopped": True}
                interval_start, interval_steps = time.perf_counter(), 0  # eval/checkpoint time is not training
        bar.close()
        self.checkpoints.wait()
        self.checkpoints.close()
        self.say(
            f"done: step {last['step']}, val loss {last.get('val_loss', float('nan')):.4f}, "
            f"{last['elapsed_sec']:.0f} s, {last['tokens_per_sec']:,.0f} tokens/s, MFU {last['mfu']:.1%}; "
            f"checkpoints in {self.checkpoints.directory}"
        )
        return last

    def _check_finite(self, losses: list[float], first_step: int, bar) -> None:
        for offset, loss in enumerate(losses):
            if not math.isfinite(loss):
                bar.close()
                self.checkpoints.wait()
                raise UserError(
                    f"loss became {loss} at step {first_step + offset}; the last good checkpoint (step "
                    f"{self.checkpoints.latest_step()}) is kept. Lower train.lr or raise train.warmup_steps"
                )


# The fields that decide the parameters' shapes and meaning (not dropout, dtypes or layout).
ARCHITECTURE_FIELDS = (
    "vocab_size",
    "block_size",
    "n_layer",
    "n_head",
    "n_kv_head",
    "d_model",
    "mlp_hidden",
    "activation",
    "norm",
    "norm_position",
    "norm_eps",
    "position",
    "rope_theta",
    "rope_scaling",
    "bias",
    "tie_embeddings",
)


def compiled_steps(run: RunConfig, mesh):
    """(initial state, train_step, eval_step) of a run, jitted for `mesh`: what `Trainer`
    trains with and what bench/ times. The state is born sharded (jit with out_shardings):
    no device ever holds all of it. The old state's buffers are donated to the new one."""
    model = GPT(run.model)
    optimizer = make_optimizer(run.train)
    create = partial(create_train_state, run.model, optimizer, run.train.seed)
    state_shardings = sharding.shardings_like(jax.eval_shape(create), mesh)
    state = jax.jit(create, out_shardings=state_shardings)()
    batch_sharding = sharding.batch_sharding(mesh)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    step = jax.jit(
        partial(train_step, model=model, optimizer=optimizer, microbatches=run.train.microbatches),
        in_shardings=(state_shardings, batch_sharding),
        out_shardings=(state_shardings, replicated),
        donate_argnums=0,
    )
    evaluate = jax.jit(
        partial(eval_step, model=model),
        in_shardings=(state_shardings.params, batch_sharding),
        out_shardings=replicated,
    )
    return state, step, evaluate


def _warn(message: str) -> None:
    """Warnings print even with progress output off: they report something the user must know."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def check_batch_fits_mesh(run: RunConfig, mesh) -> None:
    parallel = sharding.data_parallel_size(mesh)
    per_microbatch = run.train.batch_size // run.train.microbatches
    if per_microbatch % parallel or run.train.batch_size % jax.process_count():
        raise UserError(
            f"train.batch_size={run.train.batch_size} (over {run.train.microbatches} microbatches) does not split "
            f"over the {parallel} data-parallel devices of mesh {dict(mesh.shape)}; make batch_size / microbatches "
            f"a multiple of {parallel}, or set mesh.data / mesh.fsdp smaller"
        )
