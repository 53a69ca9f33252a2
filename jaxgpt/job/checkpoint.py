"""Checkpoints with orbax: the train state plus a JSON record of the run (config, tokenizer,
step, elapsed time), written asynchronously and atomically.

Orbax writes each step into a `<step>.orbax-checkpoint-tmp-*` folder and renames it when
complete, so a crash mid-save never leaves a checkpoint that looks finished; the trainer's
manager removes such leftovers when it opens the directory. Readers (sampling, plotting,
another process looking at a run in progress) open the folder read-only: they never delete
a writer's unfinished save. A complete checkpoint that still cannot be read (a truncated file,
a bad disk) is skipped for the one before it; the trainer moves it aside to
`<step>.unreadable` — never deleted.

Which are kept: the newest `keep`, and beside them the one with the lowest validation loss of
those saved at an evaluation, so a run that diverges slowly (its loss climbing without
becoming NaN) never prunes its best state away.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import shutil
import sys
from functools import partial
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from jaxgpt.config import MeshConfig, run_config_from_dict
from jaxgpt.errors import UserError, warn_once
from jaxgpt.model.transformer import init_params
from jaxgpt.sharding import laid_out, make_mesh
from jaxgpt.tokenizers import same_tokenizer, tokenizer_from_dict

PRUNED_RETRIES = 3  # listings read again when a reader finds its checkpoints pruned under it


def scheduled_steps(train) -> frozenset[int]:
    """The steps train.checkpoint_schedule keeps for good: "log", each about √2 times the last."""
    if train.checkpoint_schedule != "log":
        return frozenset()
    return frozenset(
        s for s in (round(2 ** (i / 2)) for i in range(2 * train.steps.bit_length() + 1)) if s <= train.steps
    )


def unused_sibling(path: Path, suffix: str, bare_first: bool = False) -> Path:
    """path with `.{suffix}-1`, `-2`, ... appended (with `bare_first`: `.{suffix}`, then `-2`,
    ...): the first name not taken, for what is moved aside rather than deleted."""
    names = (f"{path.name}.{suffix}" + ("" if bare_first and n == 1 else f"-{n}") for n in range(1, 100_000))
    return next(p for name in names if not (p := path.with_name(name)).exists())


@functools.cache
def _write_each_cpu_array_whole() -> None:
    """Orbax's default splits the writing of a replicated array among its replicas, so that
    devices copy their parts to the host in parallel (and hosts write theirs). CPU devices share
    the host's memory: nothing is copied, and the split costs one slicing operation per replica
    per array, each compiled at its first save (a large part of a small model's run on several
    CPU devices). On CPU one replica writes each array whole; the files are the same."""
    if jax.process_count() == 1 and all(device.platform == "cpu" for device in jax.devices()):
        # orbax's own default handler, but for the split; its metadata store keeps what a plain
        # array lacks (a PRNG key's type: without it the key restores as uint32 words)
        try:  # orbax's default, not exported (tests/test_private_apis.py says when it moves)
            from orbax.checkpoint._src.metadata import array_metadata_store
        except ImportError:  # another orbax: its own default handler, split writes and all
            return
        whole = ocp.type_handlers.ArrayHandler(
            use_replica_parallel=False, array_metadata_store=array_metadata_store.Store()
        )
        with _orbax_warnings_silenced():  # orbax warns of the override it was asked for
            ocp.type_handlers.register_type_handler(jax.Array, whole, override=True)


@contextlib.contextmanager
def _orbax_warnings_silenced(silenced: bool = True):
    """Orbax's warnings (absl's logger) held back inside the block, where they are expected."""
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR if silenced else level)
    try:
        yield
    finally:
        absl_logger.setLevel(level)


class Checkpoints:
    """The checkpoints of one run, in `directory`: the newest `keep`, the best by validation
    loss, and those of the `scheduled` steps (train.checkpoint_schedule's). `read_only` opens
    them for reading alone: nothing in the folder is created, moved or deleted."""

    def __init__(self, directory: Path, keep: int = 3, read_only: bool = False, scheduled=frozenset()):
        self.directory = Path(directory).absolute()
        self.read_only = read_only
        self.scheduled = frozenset(scheduled)  # kept for good, whatever `keep` says
        policies = ocp.checkpoint_managers
        kept = policies.AnyPreservationPolicy(
            [
                policies.LatestN(n=keep),
                # sorted by val_loss, highest first, the last n kept: the lowest
                policies.BestN(
                    get_metric_fn=lambda metrics: metrics["val_loss"],
                    reverse=True,
                    n=1,
                    keep_checkpoints_without_metrics=False,
                ),
            ]
            + ([policies.CustomSteps(steps=sorted(scheduled))] if scheduled else [])
        )
        self._options = ocp.CheckpointManagerOptions(
            preservation_policy=None if read_only else kept,
            # orbax writes a save's metrics (and reads them back on opening) only where it is told
            # how to rank them; the ranking that prunes is the policy's above
            best_fn=lambda metrics: metrics["val_loss"],
            best_mode="min",
            save_interval_steps=0 if read_only else 1,
            enable_async_checkpointing=True,
            cleanup_tmp_directories=not read_only,
            create=not read_only,
            read_only=read_only,
        )
        if not read_only:
            _write_each_cpu_array_whole()
        self._manager = self._open()

    def _open(self) -> ocp.CheckpointManager:
        # orbax logs a warning that a read-only folder is read-only: true, and not the user's concern
        with _orbax_warnings_silenced(self.read_only):
            return ocp.CheckpointManager(self.directory, options=self._options)

    def save(self, step: int, state, record: dict, val_loss: float | None = None) -> None:
        """Start writing `state` and `record` for `step`; training goes on while it writes.
        `val_loss`: the validation loss evaluated at this step, if it was, by which the best
        checkpoint is kept."""
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), record=ocp.args.JsonSave(record))
        self.check_for_errors()
        self.check_room_for(state)
        metrics = {"val_loss": val_loss} if val_loss is not None and math.isfinite(val_loss) else None
        try:
            with _orbax_warnings_silenced(metrics is None):  # a save between evaluations has none to rank by
                self._manager.save(step, args=args, force=True, metrics=metrics)
        except Exception as error:  # orbax/TensorStore raise many types (ValueError: RESOURCE_EXHAUSTED, ...)
            raise self._save_failed(error) from None

    def check_room_for(self, state) -> None:
        """Refuse to start a save the disk cannot hold: a write that fails half way leaves
        orbax's background threads failing noisily, while this is one clear line."""
        needed = sum(leaf.nbytes for leaf in jax.tree.leaves(state)) + 2**20  # + metadata
        free = shutil.disk_usage(self.directory).free
        if free < needed:
            kept = "the earlier checkpoints are kept" if self.steps() else "nothing was saved"
            raise UserError(
                f"the disk holding {self.directory} has {free / 2**20:,.1f} MiB free and a checkpoint needs "
                f"{needed / 2**20:,.1f} MiB; {kept}. Free some space (or point --workdir elsewhere) and rerun the "
                "same command"
            )

    def check_for_errors(self) -> None:
        """Raise a UserError if a save started earlier has failed (a full disk, a lost mount):
        called every logging step, so a failed write is reported within one interval."""
        try:
            self._manager.check_for_errors()
        except Exception as error:
            raise self._save_failed(error) from None

    def _save_failed(self, error: Exception) -> UserError:
        return UserError(
            f"writing a checkpoint to {self.directory} failed ({_brief(error)}); the earlier checkpoints are "
            "kept. Free some disk space (or point --workdir elsewhere) and rerun the same command to resume"
        )

    def steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def best(self) -> tuple[int, float] | None:
        """(step, val loss) of the kept checkpoint with the lowest validation loss, of those saved
        at an evaluation; None if there is none."""
        if not any(self._manager.metrics(step) for step in self.steps()):
            return None
        step = self._manager.best_step()
        return step, self._manager.metrics(step)["val_loss"]

    def read_record(self, step: int) -> dict:
        return self._manager.restore(step, args=ocp.args.Composite(record=ocp.args.JsonRestore()))["record"]

    def restore(self, step: int, like, *, part: bool = False):
        """The state saved at `step`, laid out like `like` (arrays or ShapeDtypeStructs with
        shardings: a checkpoint restores onto whatever devices `like` names). With `part`,
        `like` is a dict of some of the state's fields, e.g. {"params": ...}, and only those
        are read: sampling needs no optimizer state, so it never builds one."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        if part:
            restore_args = ocp.checkpoint_utils.construct_restore_args(abstract)
            args = ocp.args.PyTreeRestore(abstract, restore_args=restore_args, partial_restore=True)
        else:
            args = ocp.args.StandardRestore(abstract)
        return self._manager.restore(step, args=ocp.args.Composite(state=args))["state"]

    def restore_latest_readable(
        self, like, check_record=None, warn=print, *, part: bool = False
    ) -> tuple[int, object, dict] | None:
        """(step, state, record) of the newest checkpoint that reads back whole, or None if
        there are none. `like` is the state's layout, or a function of the record giving it
        (a reader learns the model from the record); `part` as in `restore`.
        `check_record(record)` runs before the arrays are read and may raise to refuse a
        checkpoint of another run (a mismatch is not damage). Unreadable newer checkpoints are
        reported through `warn` and, unless read-only, moved aside; if none can be read, a
        UserError says so and nothing is moved. A checkpoint that vanished while it was read
        was pruned by a trainer still writing the run (a reader beside it): not damage, so the
        listing is read again and the newer checkpoints tried."""
        for _ in range(PRUNED_RETRIES):
            failures, pruned = [], False
            for step in reversed(self.steps()):
                try:
                    record = self.read_record(step)
                    if check_record is not None:
                        check_record(record)
                    state = self.restore(step, like(record) if callable(like) else like, part=part)
                except UserError:
                    raise
                except Exception as error:  # orbax/TensorStore raise many types for damaged files
                    if not (self.directory / str(step)).exists():
                        pruned = True
                        break
                    failures.append((step, error))
                    continue
                if failures:
                    self._move_aside(failures, step, warn)
                return step, state, record
            if not pruned:
                break
            self._reopen()  # the manager caches the step list
        if failures:
            fix = (
                "train the run again or restore its checkpoints from a backup"
                if self.read_only
                else "restore them from a backup, or start afresh with --fresh (the old run is kept aside)"
            )
            raise UserError(
                f"none of the {len(failures)} checkpoints in {self.directory} can be read (newest: step "
                f"{failures[0][0]}, {_brief(failures[0][1])}); nothing was changed. {fix[0].upper()}{fix[1:]}"
            )
        return None

    def _reopen(self) -> None:
        self._manager.close()
        self._manager = self._open()

    def abandon_after(self, step: int) -> None:
        """Make `step` the newest checkpoint: later ones are moved to `<step>.abandoned` (-2, ...)."""
        if step not in self.steps():
            raise UserError(
                f"--from_step {step}: there is no checkpoint of step {step} in {self.directory} (there are: "
                f"{', '.join(map(str, self.steps())) or 'none'}); pass one of those"
            )
        if jax.process_index() == 0:
            for later in (s for s in self.steps() if s > step):
                (self.directory / str(later)).rename(
                    unused_sibling(self.directory / str(later), "abandoned", bare_first=True)
                )
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("jaxgpt: later checkpoints moved aside")
        self._reopen()  # the manager caches the step list

    def _move_aside(self, failures: list, good: int, warn) -> None:
        if self.read_only:
            for bad, error in failures:
                warn(f"checkpoint {bad} cannot be read ({_brief(error)}); using step {good} instead")
            return
        if jax.process_index() == 0:  # one process renames; the others wait for it
            for bad, error in failures:
                aside = unused_sibling(self.directory / str(bad), "unreadable", bare_first=True)
                warn(f"checkpoint {bad} cannot be read ({_brief(error)}); moved to {aside.name}, resuming from {good}")
                (self.directory / str(bad)).rename(aside)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("jaxgpt: unreadable checkpoints moved aside")
        self._reopen()  # the manager caches the step list

    def wait(self) -> None:
        """Block until every started save is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Finish every started save, then release the folder."""
        try:
            self._manager.wait_until_finished()
        finally:
            self._manager.close()


def _brief(error: Exception) -> str:
    """The error's type and the first line of its message, cut to fit a warning. Some of
    TensorStore's errors carry no text of their own (their str is the repr of a bound
    method): the type alone then, rather than that."""
    text = (str(error).splitlines() or [""])[0]
    return type(error).__name__ + ("" if not text or text.startswith("<bound method") else f": {text[:200]}")


def _ignore_closed_event_loop(hook):
    """sys.unraisablehook, less the one error orbax's reads leave behind when a checkpoint is
    damaged: the reads still in flight finish after its event loop closed, and each would print
    a traceback of `RuntimeError: Event loop is closed` (14 of them for one bad checkpoint)."""

    def quieter(unraisable):
        value = unraisable.exc_value
        if not (isinstance(value, RuntimeError) and str(value) == "Event loop is closed"):
            hook(unraisable)

    quieter.jaxgpt = True
    return quieter


if not getattr(sys.unraisablehook, "jaxgpt", False):
    sys.unraisablehook = _ignore_closed_event_loop(sys.unraisablehook)


def _not_a_leftover_read(record: logging.LogRecord) -> bool:
    """The other trace those reads leave, when one fails before it is awaited: asyncio logs
    `Task exception was never retrieved` (orbax's coroutine, async_deserialize) or `Future
    exception was never retrieved` (TensorStore's own future, its error naming its
    tensorstore_spec) as it is collected. The failure is already reported, once, by the
    checkpoint's warning."""
    message = record.getMessage()
    lost = message.startswith(("Task exception was never retrieved", "Future exception was never retrieved"))
    return not (lost and ("async_deserialize" in message or "tensorstore_spec" in message))


logging.getLogger("asyncio").addFilter(_not_a_leftover_read)


def saved_steps(workdir: Path) -> list[int]:
    """The steps of the checkpoint folders in `workdir`/checkpoints, from their names alone
    (orbax not opened: a check before any slow work); [] where there are none."""
    directory = Path(workdir) / "checkpoints"
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if directory.is_dir() else []


def recorded_config(workdir: Path) -> dict:
    """The configuration a run's newest readable checkpoint records, for a workdir that lost
    its config.json: the run resumes with it, and training writes config.json anew."""
    checkpoints = Checkpoints(workdir / "checkpoints", read_only=True)
    try:
        for step in reversed(checkpoints.steps()):
            try:
                record = checkpoints.read_record(step)
            except Exception:  # a damaged record: the one before may do
                continue
            warn_once(f"{workdir} has no config.json; using the configuration its checkpoint of step {step} records")
            return {section: dict(values) for section, values in record["config"].items()}
    finally:
        checkpoints.close()
    raise UserError(
        f"{workdir} has no config.json and no checkpoint whose record can be read; pass --config with the config "
        "file the run was trained with (and its overrides)"
    )


def load_latest(workdir: Path, mesh=None, warn=print, step: int | None = None):
    """(run config, params, tokenizer, step) of a workdir's newest checkpoint (or of `step`'s):
    all that sampling needs, read from the checkpoint alone. The state is restored straight
    into the shardings the rules of jaxgpt/sharding.py give it on `mesh`; without one, onto
    this process's first device (whatever layout the run was saved from). The folder is opened
    read-only, so this is safe beside a trainer still writing to it; an unreadable newest
    checkpoint is reported through `warn` and the one before it used."""
    directory = Path(workdir) / "checkpoints"
    if not directory.is_dir():
        raise UserError(f"no checkpoints in {workdir}; train first (python train.py --config ... --workdir {workdir})")
    checkpoints = Checkpoints(directory, read_only=True)
    try:
        if checkpoints.latest_step() is None:
            raise UserError(f"no complete checkpoint in {directory}; train first or point --workdir at a finished run")
        mesh = mesh if mesh is not None else make_mesh(MeshConfig(data=1, fsdp=1, tensor=1))
        layouts: dict = {}

        def like_for(record: dict):  # the parameters' shapes follow the record's config
            run = run_config_from_dict(record["config"])
            layouts["run"] = run
            return {"params": laid_out(jax.eval_shape(partial(init_params, run.model, jax.random.key(0))), mesh)}

        if step is None:
            step, state, record = checkpoints.restore_latest_readable(like_for, warn=warn, part=True)
        elif step in checkpoints.steps():
            record = checkpoints.read_record(step)
            state = checkpoints.restore(step, like_for(record), part=True)
        else:
            kept = ", ".join(map(str, checkpoints.steps()))
            raise UserError(f"--step {step}: {directory} keeps no checkpoint of step {step}; it keeps {kept}")
    finally:
        checkpoints.close()
    return layouts["run"], state["params"], recorded_tokenizer(Path(workdir), record["tokenizer"]), step


def recorded_tokenizer(workdir: Path, recorded: dict):
    """The tokenizer a checkpoint's record names: read from the run's own tokenizer.json, which
    keeps its vocabulary whole (jaxgpt/tokenizers.py), where that is the one named, else from
    the record alone (its source)."""
    try:
        saved = json.loads((workdir / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        saved = None
    return tokenizer_from_dict(saved if isinstance(saved, dict) and same_tokenizer(recorded, saved) else recorded)
