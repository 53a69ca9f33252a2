"""Continuing a run: what a checkpoint must agree on, and where a resumed run picks up.

A checkpoint holds the training state and a record of the run that wrote it (its config,
tokenizer, elapsed time and the losses of an unfinished logging interval). Resuming restores
the newest readable one, refuses it if it comes from another run, and trims metrics.jsonl back
to the restored step so the resumed run's lines are written once.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path

import jax

from jaxgpt.config import RunConfig, run_config_from_dict
from jaxgpt.errors import UserError
from jaxgpt.job.checkpoint import Checkpoints, unused_sibling
from jaxgpt.job.metrics import metrics_lines
from jaxgpt.job.pretrained import EXTENSIBLE_FIELDS, start_from_pretrained
from jaxgpt.tokenizers import same_tokenizer
from jaxgpt.training.optimizer import schedule_change_note

# What a resumed run may change: how long it runs (raising steps also moves the end of the
# cosine schedule), the learning-rate schedule and clipping (the optimizer state does not
# depend on them), how often it logs, evaluates (multiple-choice questions too) and saves, and
# how the same math is laid out (microbatches, attention kernel, rematerialisation, mesh).
# Anything else changes the model, the data or the batches, and a checkpoint of another run
# cannot continue it.
RESUMABLE_FIELDS = frozenset(
    {
        "train.steps",
        "train.lr",  # lowering the learning rate is the way on after a divergence
        "train.warmup_steps",
        "train.decay_steps",
        "train.cooldown_steps",
        "train.grad_clip",
        "train.min_lr",
        "train.eval_every",
        "train.eval_batches",
        "train.log_every",
        "train.log_layer_grad_norms",
        "train.lab",  # measured beside evaluation, changing nothing trained
        "train.checkpoint_schedule",
        "train.multiple_choice",
        "train.multiple_choice_every",
        "train.multiple_choice_limit",
        "train.checkpoint_every",
        "train.keep_checkpoints",
        "train.microbatches",
        "train.one_program_for_cores",
        "train.tensorboard",
        "train.wandb_project",
        "model.attention",
        "model.remat",
        "data.cache_dir",
        "data.shard_tokens",  # the files the tokens are kept in, not the tokens
        "mesh.data",  # a checkpoint restores onto any device layout
        "mesh.fsdp",
        "mesh.tensor",
        "mesh.expert",
    }
)

WEIGHTS_ONLY = "weights_only"  # a record's mark of weights without an optimizer state (evaluate --prune --out)


def resume_conflicts(saved: dict, current: dict) -> list[str]:
    """'key: saved -> current' for every difference between two RunConfig dicts outside
    RESUMABLE_FIELDS."""
    conflicts = []
    saved = with_defaults(saved)
    for section in ("model", "data", "train", "mesh"):
        for key in sorted(set(saved.get(section, {})) | set(current.get(section, {}))):
            before, after = saved.get(section, {}).get(key), current.get(section, {}).get(key)
            if before != after and f"{section}.{key}" not in RESUMABLE_FIELDS:
                conflicts.append(f"{section}.{key}: {before!r} -> {after!r}")
    return conflicts


def with_defaults(saved: dict) -> dict:
    """A saved RunConfig dict with the fields added since it was written at their defaults
    (every new field is off by default, so an older run is what that default describes)."""
    try:
        return run_config_from_dict(saved).to_dict()
    except (TypeError, ValueError):  # a field since removed: compare as saved, and report it
        return saved


def checkpoint_record(step: int, elapsed: float, pending_losses: list[float], config: RunConfig, tokenizer) -> dict:
    """What travels beside the state in a checkpoint: enough to refuse another run's
    checkpoint and to continue this one's metrics exactly."""
    return {
        "step": step,
        "elapsed_sec": elapsed,
        "pending_losses": pending_losses,
        "config": config.to_dict(),
        "tokenizer": tokenizer.to_dict(),
    }


@dataclasses.dataclass(frozen=True)
class StartingPoint:
    """Where a run begins: the state and step, the wall time already spent, and the losses of
    an unfinished logging interval carried over from the checkpoint."""

    state: object
    step: int = 0
    elapsed_before: float = 0.0
    carried_losses: tuple[float, ...] = ()
    params_at_start: object = None  # step 0's parameters, a copy of their own, where asked (keep_start)


def restore_or_start(
    checkpoints: Checkpoints,
    fresh_state,
    config: RunConfig,
    tokenizer,
    workdir: Path,
    keep_start: bool,
    *,
    main: bool,
    say,
    warn,
) -> StartingPoint:
    """Continue from the newest readable checkpoint, or start at step 0 if there is none
    (from `train.init_from`'s weights when set). Refuses a checkpoint of another run before
    anything is written. keep_start: return beside it step 0's parameters (train.init_from's
    weights or the initialisation), the same whether the run starts now or resumes: the frozen
    reference train.rl.kl measures the policy against."""
    metrics_path = workdir / "metrics.jsonl"
    checkpoints.check_room_for(fresh_state)  # before any work, not at the first save
    found = checkpoints.restore_latest_readable(
        fresh_state,
        check_record=partial(refuse_another_run, config=config, tokenizer=tokenizer, workdir=workdir),
        warn=warn,
    )
    start = fresh_state
    if config.train.init_from and (found is None or keep_start):  # a resumed run reads them only as its reference
        start, origin = start_from_pretrained(fresh_state, config, config.train.init_from, tokenizer)
    # a copy: the step donates the state it is given, and the reference outlives it
    params_at_start = jax.tree.map(lambda x: x.copy(), start.params) if keep_start else None
    if found is None:
        if config.train.init_from:
            say(f"initialised from {origin}")
        if main:
            keep_history_aside(workdir, metrics_path, warn)
            metrics_path.write_text("")
        return StartingPoint(start, params_at_start=params_at_start)
    step, state, record = found
    note = schedule_change_note(record["config"]["train"], config.train, step)
    if note:
        say(note)
    if main:
        truncate_metrics(metrics_path, step)
    say(f"resuming from step {step} of {config.train.steps}")
    return StartingPoint(
        state, step, record.get("elapsed_sec", 0.0), tuple(record.get("pending_losses", [])), params_at_start
    )


def refuse_another_run(record: dict, *, config: RunConfig, tokenizer, workdir: Path) -> None:
    """One line where a checkpoint's record (`record`) is not a run `config` may continue."""
    if record.get(WEIGHTS_ONLY):  # evaluate --prune --out's folders: nothing to continue an optimizer from
        raise UserError(
            f"cannot resume {workdir}: it holds weights alone, with no optimizer state (written by "
            f"`jaxgpt evaluate --prune --out`); train from them in a new folder: "
            f"--config.train.init_from={workdir} --workdir NEW_DIR"
        )
    conflicts = resume_conflicts(record["config"], config.to_dict())
    if not same_tokenizer(record["tokenizer"], tokenizer.to_dict()):
        conflicts.append("the tokenizer's vocabulary")
    if conflicts:
        extending = all(
            c.split(":")[0] in ("model.block_size", *(f"model.{f}" for f in EXTENSIBLE_FIELDS)) for c in conflicts
        )
        raise UserError(
            f"cannot resume {workdir}: its checkpoints come from another run ({'; '.join(conflicts)}). "
            + (
                f"To extend its context, start a new run from its weights: --config.train.init_from={workdir} "
                "--workdir NEW_DIR"
                if extending
                else "Use the original config, or start afresh with --fresh (the old run is kept aside). "
                f"A resume may change only {', '.join(sorted(RESUMABLE_FIELDS))}"
            )
        )


def keep_history_aside(workdir: Path, metrics_path: Path, warn) -> None:
    """Starting at step 0 in a workdir that already logged a run (its checkpoints were
    deleted, or it crashed before its first one): move that run's metrics aside rather than
    overwrite them."""
    logged = [p for p in (metrics_path, workdir / "tensorboard") if p.exists()]
    if not any(p.is_dir() or p.stat().st_size for p in logged):
        return
    aside = unused_sibling(workdir / "history", "before-restart")
    aside.mkdir()
    for path in logged:
        path.rename(aside / path.name)
    warn(
        f"{workdir} has metrics but no checkpoint to resume from; starting at step 0, the old metrics are kept in "
        f"{aside}"
    )


def truncate_metrics(metrics_path: Path, step: int) -> None:
    """Drop lines past the restored step: the resumed run writes them again."""
    if not metrics_path.exists():
        return
    kept = [line for line, record in metrics_lines(metrics_path) if record["step"] <= step]
    tmp = metrics_path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(metrics_path)
