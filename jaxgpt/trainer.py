"""The training loop: the stateful shell around the pure `train_step`.

`train_and_evaluate(config, workdir)` prepares data, builds (or restores) the state, and runs
the compiled step, fetching metrics from the device only at log, eval and checkpoint steps so
the accelerator is never stalled by the host.

A workdir holds everything of a run:
  config.json       the resolved configuration (every field, vocab_size filled in)
  tokenizer.json    the tokenizer, so sampling needs nothing else
  metrics.jsonl     one JSON object per logged step
  checkpoints/      orbax checkpoints, each with the state and a record of the run
"""

from __future__ import annotations

import json
import math
import time
from functools import partial
from pathlib import Path

import jax
import numpy as np
from tqdm import tqdm

from jaxgpt import data
from jaxgpt.checkpoint import Checkpoints
from jaxgpt.config import RunConfig, resolve
from jaxgpt.errors import UserError
from jaxgpt.hardware import peak_flops
from jaxgpt.model import GPT, count_params, flops_per_token
from jaxgpt.optimizer import learning_rate_schedule, make_optimizer
from jaxgpt.tokenizers import save_tokenizer
from jaxgpt.train_step import create_train_state, eval_step, train_step


def train_and_evaluate(config, workdir: str | Path, *, progress: bool = True) -> dict:
    """Train the model `config` describes (a ConfigDict, nested dict or RunConfig), writing
    the run into `workdir`. Returns the last metrics record."""
    workdir = Path(workdir)
    if workdir.exists() and not workdir.is_dir():
        raise UserError(f"workdir {workdir} is a file; pass --workdir a directory (new or from an earlier run)")
    run = config if isinstance(config, RunConfig) else resolve(config)  # validate before slow work
    dataset = data.prepare(run.data, progress=progress)
    if not isinstance(config, RunConfig):
        run = resolve(config, vocab_size=dataset.tokenizer.vocab_size)
    data.check_long_enough(dataset, run.model.block_size)

    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(json.dumps(run.to_dict(), indent=2))
    save_tokenizer(dataset.tokenizer, workdir / "tokenizer.json")
    return Trainer(run, dataset, workdir, progress).run()


class Trainer:
    def __init__(self, run: RunConfig, dataset: data.Dataset, workdir: Path, progress: bool):
        self.config, self.dataset, self.workdir, self.progress = run, dataset, workdir, progress
        self.model = GPT(run.model)
        optimizer = make_optimizer(run.train)
        self.schedule = learning_rate_schedule(run.train)
        self.train_step = jax.jit(
            partial(train_step, model=self.model, optimizer=optimizer, microbatches=run.train.microbatches),
            donate_argnums=0,
        )
        self.eval_step = jax.jit(partial(eval_step, model=self.model))
        self.state = jax.jit(partial(create_train_state, run.model, optimizer, run.train.seed))()
        self.checkpoints = Checkpoints(workdir / "checkpoints", run.train.keep_checkpoints)
        self.metrics_path = workdir / "metrics.jsonl"
        self.tokens_per_step = run.train.batch_size * run.model.block_size
        self.flops_per_step = flops_per_token(run.model, run.model.block_size) * self.tokens_per_step
        self.peak_flops, self.peak_source = peak_flops()

    def batch(self, step: int) -> jax.Array:
        t = self.config.train
        return jax.device_put(
            data.batch_at(
                self.dataset.train, self.config.model.block_size, t.batch_size, t.seed, data.TRAIN_STREAM, step
            )
        )

    def evaluate(self) -> dict:
        t, seq = self.config.train, self.config.model.block_size
        out = {}
        for name, tokens, stream in (
            ("val_loss", self.dataset.val, data.EVAL_VAL_STREAM),
            ("eval_train_loss", self.dataset.train, data.EVAL_TRAIN_STREAM),
        ):
            losses = [
                self.eval_step(self.state.params, data.batch_at(tokens, seq, t.batch_size, t.seed, stream, i))
                for i in range(t.eval_batches)
            ]
            out[name] = float(np.mean(jax.device_get(losses)))
        return out

    def record(self, step: int, elapsed: float) -> dict:
        """What a checkpoint carries besides the arrays: enough to resume and to sample."""
        return {
            "step": step,
            "elapsed_sec": elapsed,
            "config": self.config.to_dict(),
            "tokenizer": self.dataset.tokenizer.to_dict(),
        }

    def restore_or_start(self) -> tuple[int, float]:
        step = self.checkpoints.latest_step()
        if step is None:
            self.metrics_path.write_text("")
            return 0, 0.0
        self.state = self.checkpoints.restore(step, self.state)
        elapsed = self.checkpoints.read_record(step).get("elapsed_sec", 0.0)
        self._truncate_metrics(step)
        self.say(f"resuming from step {step} of {self.config.train.steps}")
        return step, elapsed

    def _truncate_metrics(self, step: int) -> None:
        """Drop metrics past the restored step: the resumed run writes them again."""
        if not self.metrics_path.exists():
            return
        kept = [
            line for line in self.metrics_path.read_text().splitlines() if line and json.loads(line)["step"] <= step
        ]
        tmp = self.metrics_path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(self.metrics_path)

    def say(self, message: str) -> None:
        if self.progress:
            tqdm.write(message)

    def run(self) -> dict:
        t = self.config.train
        start, elapsed_before = self.restore_or_start()
        n_params = count_params(self.state.params)
        self.say(
            f"model: {n_params:,} parameters, {self.tokens_per_step:,} tokens/step; devices: {jax.device_count()} x "
            f"{jax.devices()[0].device_kind}; peak {self.peak_flops / 1e9:,.0f} GFLOP/s ({self.peak_source})"
        )
        last: dict = {"step": start}
        if start >= t.steps:
            self.say(f"already trained to step {start}; raise train.steps to continue")
            self.checkpoints.close()
            return last

        compile_start = time.perf_counter()
        first = self.batch(start)
        step_fn = self.train_step.lower(self.state, first).compile()
        self.say(f"compiled train_step in {time.perf_counter() - compile_start:.1f} s")

        bar = tqdm(total=t.steps, initial=start, desc="train", unit="step", disable=not self.progress)
        batches = data.prefetch(self.batch, range(start + 1, t.steps))
        pending: list[dict] = []  # device-side metrics since the last record
        clock = interval_start = time.perf_counter()
        interval_first_step = start
        with self.metrics_path.open("a") as metrics_file:
            for step in range(start, t.steps):
                self.state, metrics = step_fn(self.state, first if step == start else next(batches))
                pending.append(metrics)
                done = step + 1
                bar.update(1)
                is_last = done == t.steps
                logs = done % t.log_every == 0 or is_last
                evals = done % t.eval_every == 0 or is_last
                saves = done % t.checkpoint_every == 0 or is_last
                if not (logs or evals or saves):
                    continue
                fetched = jax.device_get(pending)  # the only host sync in the loop
                losses = [float(m["loss"]) for m in fetched]
                if not all(map(math.isfinite, losses)):
                    bad = interval_first_step + 1 + next(i for i, x in enumerate(losses) if not math.isfinite(x))
                    bar.close()
                    self.checkpoints.wait()
                    raise UserError(
                        f"loss became {losses[bad - interval_first_step - 1]} at step {bad}; the last good checkpoint "
                        f"(step {self.checkpoints.latest_step()}) is kept. Lower train.lr or raise train.warmup_steps"
                    )
                now = time.perf_counter()
                tokens_per_sec = self.tokens_per_step * len(fetched) / (now - interval_start)
                last = {
                    "step": done,
                    "train_loss": float(np.mean(losses)),
                    "lr": float(self.schedule(step)),
                    "grad_norm": float(fetched[-1]["grad_norm"]),
                    "tokens_per_sec": tokens_per_sec,
                    "mfu": tokens_per_sec * self.flops_per_step / self.tokens_per_step / self.peak_flops,
                    "elapsed_sec": elapsed_before + now - clock,
                }
                if evals:
                    last |= self.evaluate()
                metrics_file.write(json.dumps(last) + "\n")
                metrics_file.flush()
                bar.set_postfix(loss=f"{last['train_loss']:.3f}", tok_s=f"{tokens_per_sec:,.0f}")
                if evals:
                    self.say(f"step {done}: train {last['eval_train_loss']:.4f}, val {last['val_loss']:.4f}")
                if saves:
                    self.checkpoints.save(done, self.state, self.record(done, last["elapsed_sec"]))
                pending, interval_first_step = [], done
                interval_start = time.perf_counter()  # eval and checkpoint time is not training time
        bar.close()
        self.checkpoints.wait()
        self.checkpoints.close()
        self.say(
            f"done: step {last['step']}, val loss {last.get('val_loss', float('nan')):.4f}, "
            f"{last['elapsed_sec']:.0f} s, {last['tokens_per_sec']:,.0f} tokens/s, MFU {last['mfu']:.1%}; "
            f"checkpoints in {self.checkpoints.directory}"
        )
        return last
