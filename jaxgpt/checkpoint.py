"""Checkpoints with orbax: the train state plus a JSON record of the run (config, tokenizer,
step, elapsed time), written asynchronously and atomically.

Orbax writes each step into a `<step>.orbax-checkpoint-tmp-*` folder and renames it when
complete, so a crash mid-save never leaves a checkpoint that looks finished.
"""

from __future__ import annotations

from pathlib import Path

import jax
import orbax.checkpoint as ocp


class Checkpoints:
    """The checkpoints of one run, in `directory`, newest `keep` kept."""

    def __init__(self, directory: Path, keep: int = 3):
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=True, cleanup_tmp_directories=True, create=True
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

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

    def wait(self) -> None:
        """Block until every started save is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()


def load_latest(workdir: Path):
    """(run config, params, tokenizer, step) of a workdir's newest checkpoint: all that
    sampling needs, read from the checkpoint alone."""
    from functools import partial

    from jaxgpt.config import run_config_from_dict
    from jaxgpt.errors import UserError
    from jaxgpt.optimizer import make_optimizer
    from jaxgpt.tokenizers import tokenizer_from_dict
    from jaxgpt.train_step import create_train_state

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
    state = checkpoints.restore(step, like)
    checkpoints.close()
    return run, state.params, tokenizer_from_dict(record["tokenizer"]), step
