"""Where a run's metrics go: metrics.jsonl (the record everything else reads), TensorBoard
event files, and Weights & Biases when asked for.

Each logging step is one flat record such as {"step": 250, "train_loss": 2.1, "val_loss":
2.2, "lr": 0.002, "tokens_per_sec": 19000, ...}. TensorBoard gets every number as a scalar
named by the tag below, written with tensorboardX (no TensorFlow needed). On resume the event
files are told to drop anything logged after the restored step, as metrics.jsonl is truncated,
so a curve never doubles back on itself.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

from jaxgpt.errors import UserError

# metrics.jsonl key -> TensorBoard / W&B tag; grouped so TensorBoard shows losses together.
TAGS = {
    "train_loss": "loss/train",
    "eval_train_loss": "loss/eval_train",
    "val_loss": "loss/val",
    "val_bpb": "loss/val_bits_per_byte",
    "val_perplexity": "loss/val_perplexity",
    "val_loss_past_only": "loss/val_past_only",
    "val_bpb_past_only": "loss/val_bits_per_byte_past_only",
    "val_accuracy": "loss/val_accuracy",  # the masked tokens right, or the texts classified right
    "val_token_accuracy": "loss/val_answer_token_accuracy",
    "val_exact_match": "loss/val_exact_match",
    "train_ahead_loss": "loss/train_token_after_next",
    "val_ahead_loss": "loss/val_token_after_next",
    "lr": "optim/lr",
    "grad_norm": "optim/grad_norm",
    "tokens_per_sec": "speed/tokens_per_sec",
    "tokens_per_sec_per_device": "speed/tokens_per_sec_per_device",
    "mfu": "speed/mfu",
    "elapsed_sec": "speed/elapsed_sec",
}


def is_scalar(value) -> bool:
    """A number TensorBoard and W&B can draw (a classifier's confusion matrix is not)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def training_record(
    *,
    step: int,
    losses: list[float],
    lr: float,
    grad_norm: float,
    tokens: int,
    seconds: float,
    devices: int,
    flops_per_token: float,
    peak_flops: float,
    elapsed: float,
) -> dict:
    """One logging interval's record: `losses` are its per-step training losses, `tokens` were
    trained on in `seconds` of training time (evaluation and checkpointing excluded) over
    `devices`; MFU counts flops_per_token's model FLOPs against the devices' peak."""
    tokens_per_sec = tokens / seconds
    return {
        "step": step,
        "train_loss": float(np.mean(losses)),
        "lr": lr,
        "grad_norm": grad_norm,
        "tokens_per_sec": tokens_per_sec,
        "tokens_per_sec_per_device": tokens_per_sec / devices,
        "mfu": model_flops_utilisation(tokens_per_sec * flops_per_token, peak_flops),
        "elapsed_sec": elapsed,
    }


def router_record(steps: list[dict], layers: list[int]) -> dict[str, float]:
    """A mixture of experts' router over a logging interval (`steps`: each step's router
    statistics, objectives.router_statistics), averaged over the steps: per MoE layer (`layers`,
    their block numbers) each expert's load (its fraction of the assignments; 1 / experts when
    balanced), the fraction of assignments dropped at capacity and the routing entropy in nats;
    and the two router losses averaged over the layers, as the objective weighs them."""
    mean = {name: np.mean([np.asarray(step[name]) for step in steps], axis=0) for name in steps[0]}
    record = {"router/aux_loss": float(mean["aux_loss"].mean()), "router/z_loss": float(mean["z_loss"].mean())}
    for j, layer in enumerate(layers):
        record[f"router/block_{layer}/dropped"] = float(mean["dropped"][j])
        record[f"router/block_{layer}/entropy"] = float(mean["entropy"][j])
        record |= {f"router/block_{layer}/load/{e}": float(v) for e, v in enumerate(mean["load"][j])}
    return record


def model_flops_utilisation(achieved_flops: float, peak_flops: float) -> float:
    """achieved / peak, or NaN (null in metrics.jsonl) where that is above 1: a peak the run
    beats is not the hardware's peak, and an MFU over 100% would only report that error."""
    ratio = achieved_flops / peak_flops
    return ratio if ratio <= 1 else math.nan


def describe_mfu(mfu: float) -> str:
    return f"MFU {mfu:.1%}" if math.isfinite(mfu) else "MFU n/a (the run beat the peak it was measured against)"


def read_metrics(workdir: str | Path) -> list[dict]:
    """The records of a run's metrics.jsonl, in step order."""
    path = Path(workdir) / "metrics.jsonl"
    if not path.is_file():
        raise UserError(f"{path} not found; pass the workdir of a run that train.py has logged to")
    return [record for _, record in metrics_lines(path)]


def metrics_lines(path: Path) -> list[tuple[str, dict]]:
    """(line, record) for each record of a metrics.jsonl. A last line cut short (the process
    died while writing it) is left out; any other line that is not a record, or whose step is
    below the line's before it, is refused with its number: the log is the run's own record,
    cannot be made again, and is never rewritten from a damaged copy. NUL bytes are damage (a
    file zeroed by a crash of the file system), never a torn write."""
    text = path.read_text(errors="replace")
    lines = text.splitlines()
    out = []
    fix = "nothing was changed. Delete or repair that line (or move the file aside for a fresh log) and rerun"
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            if "\0" in line:
                raise ValueError("NUL bytes, as in a file zeroed by a crash")
            record = json.loads(line)
            if not isinstance(record.get("step"), int):
                raise ValueError("no integer step")
        except (ValueError, AttributeError) as error:
            if number == len(lines) and not text.endswith("\n") and "\0" not in line:
                break  # torn by a crash mid-write
            raise UserError(
                f"{path} line {number} is not a metrics record ({type(error).__name__}: {str(error)[:80]}); {fix}"
            ) from None
        if out and record["step"] < out[-1][1]["step"]:
            raise UserError(
                f"{path} line {number} goes back to step {record['step']} after step {out[-1][1]['step']} (lines "
                f"appended twice?); {fix}"
            )
        out.append((line, record))
    return out


def check_sinks_available(wandb_project: str) -> None:
    """Fail before any work if the config asks for a sink that is not installed."""
    if not wandb_project:
        return
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise UserError(
            f"train.wandb_project={wandb_project!r} needs wandb; pip install wandb, "
            "or set --config.train.wandb_project=''"
        ) from None


def lab_scalars(record: dict) -> dict[str, float]:
    """train.lab's measures (jaxgpt/lab/watch.py) as one scalar a head or a layer boundary:
    lab/induction/block_1/head_3; lab/logit_lens/embed (before block 0), then block_0 ... (after it)."""
    scalars = {}
    for key, value in record.items():
        if not key.startswith("lab_") or key.startswith("lab_pattern"):  # the patterns are the timeline's
            continue
        name = key.removeprefix("lab_")
        if value and isinstance(value[0], list):  # per head: a list per block
            scalars |= {f"lab/{name}/block_{i}/head_{h}": v for i, row in enumerate(value) for h, v in enumerate(row)}
        else:  # per layer boundary
            scalars |= {f"lab/{name}/{'embed' if i == 0 else f'block_{i - 1}'}": v for i, v in enumerate(value)}
    return scalars


def lab_images(record: dict) -> dict[str, np.ndarray]:
    """Each per-head measure as a small image (blocks down, heads across), scaled to [0, 1] by
    its own range at that step (the scalars hold the values)."""
    images = {}
    for key, value in record.items():
        if key.startswith("lab_") and not key.startswith("lab_pattern") and value and isinstance(value[0], list):
            heads = np.asarray(value, np.float64)
            span = heads.max() - heads.min()
            images[f"lab/{key.removeprefix('lab_')}/heads"] = (heads - heads.min()) / span if span > 0 else heads * 0
    return images


def json_safe(record: dict) -> dict:
    """The record with NaN and infinities as null (JSON has no such numbers; Python's json
    would write bare NaN, which other readers reject), and a note naming what they were."""
    bad = {k: v for k, v in record.items() if isinstance(v, float) and not math.isfinite(v)}
    if not bad:
        return record
    note = "; ".join(f"{k} was {v}" for k, v in bad.items())
    return {k: None if k in bad else v for k, v in record.items()} | {"nonfinite": note}


def summary_writer_class():
    """tensorboardX's SummaryWriter, imported without PyTorch. tensorboardX imports torch, where it
    is installed, only to recognise torch tensors among the values it is given; this log gives
    it Python floats, and importing torch would add seconds to every run's start. A None in
    sys.modules makes `import torch` fail as if it were absent
    (Python's import system documents it); a torch already imported is left as it is."""
    if "tensorboardX" in sys.modules or "torch" in sys.modules:
        from tensorboardX import SummaryWriter

        return SummaryWriter
    sys.modules["torch"] = None
    try:
        from tensorboardX import SummaryWriter
    finally:
        del sys.modules["torch"]
    return SummaryWriter


class MetricsLog:
    """Appends records to metrics.jsonl and mirrors them to the optional sinks. Only the main
    process of a run should make one (`enabled=False` makes a do-nothing log for the others)."""

    def __init__(
        self,
        workdir: Path,
        *,
        enabled: bool = True,
        tensorboard: bool = True,
        wandb_project: str = "",
        run_config: dict | None = None,
        resume_step: int = 0,
    ):
        self.file = (workdir / "metrics.jsonl").open("a") if enabled else None
        self.tensorboard = None
        self.wandb = None
        if enabled and tensorboard:
            SummaryWriter = summary_writer_class()
            # purge_step drops events a previous attempt logged after the checkpoint we resumed.
            self.tensorboard = SummaryWriter(str(workdir / "tensorboard"), purge_step=resume_step + 1)
        if enabled and wandb_project:
            import wandb  # present: train_and_evaluate called check_sinks_available first

            self.wandb = wandb.init(project=wandb_project, name=workdir.name, config=run_config, resume="allow")

    def write(self, record: dict) -> None:
        if self.file is None:
            return
        self.file.write(json.dumps(json_safe(record)) + "\n")
        self.file.flush()
        step = record["step"]
        scalars = {TAGS.get(key, key): value for key, value in record.items() if key != "step" and is_scalar(value)}
        scalars |= lab_scalars(record)
        if self.tensorboard is not None:
            for tag, value in scalars.items():
                if math.isfinite(value):  # as metrics.jsonl's null: no point drawn for inf or NaN
                    self.tensorboard.add_scalar(tag, value, step)
            for tag, image in lab_images(record).items():
                self.tensorboard.add_image(tag, image, step, dataformats="HW")
            self.tensorboard.flush()
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
