"""The CPU speedrun at nanoGPT's own CPU recipe's shape (4 layers, 4 heads, 128 wide, 64
characters of context, the README's comparison): configs/tiny_speedrun.py's model and optimizer,
trained to the validation loss nanoGPT reaches in 2000 steps of 12 rows in 120 steps of 48
(docs/speedrun.md has the runs, whole process, side by side)."""

from configs import tiny_speedrun


def get_config():
    config = tiny_speedrun.get_config()
    # Layers stacked: Muon then orthogonalises each kind of matrix of all four layers in one batched
    # Newton-Schulz iteration instead of four (its update 40 -> 20 ms of a step, docs/speedrun.md).
    config.model.update(block_size=64, scan_layers=True)
    # Four times the rows a step: Muon's update, the same for any batch, is paid a quarter as often
    # per token. Ten steps of warmup, not tiny's hundred, in a run of 120; one evaluation, at the end.
    config.train.update(batch_size=48, steps=120, warmup_steps=10, eval_every=120, checkpoint_every=120)
    return config
