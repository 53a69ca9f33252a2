"""Checkpoints with orbax: the train state plus a JSON record of the run (config, tokenizer,
step, elapsed time), written asynchronously and atomically.

Orbax writes each step into a `<step>.orbax-checkpoint-tmp-*` folder and renames it when
complete, so a crash mid-save never leaves a checkpoint that looks finished; the manager
removes such leftovers when it opens the directory. A complete checkpoint that still cannot be
read (a truncated file, a bad disk) is skipped for the one before it, and moved aside to
`<step>.unreadable` — never deleted.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from jaxgpt.config import MeshConfig, run_config_from_dict
from jaxgpt.errors import UserError
from jaxgpt.optimizer import make_optimizer
from jaxgpt.sharding import make_mesh, shardings_like
from jaxgpt.tokenizers import tokenizer_from_dict
from jaxgpt.train_step import create_train_state


class Checkpoints:
    """The checkpoints of one run, in `directory`, newest `keep` kept."""

    def __init__(self, directory: Path, keep: int = 3):
        self.directory = Path(directory).absolute()
        self._options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=True, cleanup_tmp_directories=True, create=True
        )
        self._manager = ocp.CheckpointManager(self.directory, options=self._options)

    def save(self, step: int, state, record: dict) -> None:
        """Start writing `state` and `record` for `step`; training goes on while it writes."""
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), record=ocp.args.JsonSave(record))
        self._manager.save(step, args=args, force=True)

    def steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def read_record(self, step: int) -> dict:
        return self._manager.restore(step, args=ocp.args.Composite(record=ocp.args.JsonRestore()))["record"]

    def restore(self, step: int, like):
        """The state saved at `step`, laid out like `like` (arrays or ShapeDtypeStructs with
        shardings: a checkpoint restores onto whatever devices `like` names)."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        restored = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
        return restored["state"]

    def restore_latest_readable(self, like, check_record=None, warn=print) -> tuple[int, object, dict] | None:
        """(step, state, record) of the newest checkpoint that reads back whole, or None if
        there are none. `check_record(record)` runs before the arrays are read and may raise to
        refuse a checkpoint of another run (a mismatch is not damage). Unreadable newer
        checkpoints are reported through `warn` and moved aside; if none can be read, a
        UserError says so and nothing is moved."""
        failures = []
        for step in reversed(self.steps()):
            try:
                record = self.read_record(step)
            except Exception as error:  # orbax/TensorStore raise many types for damaged files
                failures.append((step, error))
                continue
            if check_record is not None:
                check_record(record)
            try:
                state = self.restore(step, like)
            except Exception as error:
                failures.append((step, error))
                continue
            if failures:
                self._move_aside(failures, step, warn)
            return step, state, record
        if failures:
            raise UserError(
                f"none of the {len(failures)} checkpoints in {self.directory} can be read (newest: step "
                f"{failures[0][0]}, {_brief(failures[0][1])}); nothing was changed. Restore them from a backup, or "
                "start afresh with --fresh (the old run is kept aside)"
            )
        return None

    def _move_aside(self, failures: list, good: int, warn) -> None:
        if jax.process_index() == 0:  # one process renames; the others wait for it
            for bad, error in failures:
                reason = _brief(error)
                warn(f"checkpoint {bad} cannot be read ({reason}); moved to {bad}.unreadable, resuming from {good}")
                (self.directory / str(bad)).rename(self.directory / f"{bad}.unreadable")
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("jaxgpt: unreadable checkpoints moved aside")
        self._manager.close()  # the manager caches the step list
        self._manager = ocp.CheckpointManager(self.directory, options=self._options)

    def wait(self) -> None:
        """Block until every started save is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()


def _brief(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"


def load_latest(workdir: Path, mesh=None):
    """(run config, params, tokenizer, step) of a workdir's newest checkpoint: all that
    sampling needs, read from the checkpoint alone. The state is restored straight into the
    shardings the rules of jaxgpt/sharding.py give it on `mesh`; without one, onto this
    process's first device (whatever layout the run was saved from: a 2-core CPU run saves
    from two devices)."""
    directory = Path(workdir) / "checkpoints"
    if not directory.is_dir():
        raise UserError(f"no checkpoints in {workdir}; train first (python train.py --config ... --workdir {workdir})")
    checkpoints = Checkpoints(directory)
    step = checkpoints.latest_step()
    if step is None:
        raise UserError(f"no complete checkpoint in {directory}; train first or point --workdir at a finished run")
    record = checkpoints.read_record(step)
    run = run_config_from_dict(record["config"])
    like = jax.eval_shape(partial(create_train_state, run.model, make_optimizer(run.train), run.train.seed))
    mesh = mesh if mesh is not None else make_mesh(MeshConfig(data=1, fsdp=1, tensor=1))
    like = jax.tree.map(
        lambda s, where: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=where), like, shardings_like(like, mesh)
    )
    state = checkpoints.restore(step, like)
    checkpoints.close()
    return run, state.params, tokenizer_from_dict(record["tokenizer"]), step
