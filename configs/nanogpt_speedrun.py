"""The CPU speedrun against nanoGPT's own CPU recipe (4 layers, 4 heads, 128 wide, 64 characters
of context, 2000 steps of 12 rows; the README's comparison): configs/tiny_speedrun.py's model and
optimizer at that width and context with half the layers, trained to the validation loss nanoGPT
reaches, in 150 steps of 40 rows (docs/speedrun.md has the runs, whole process, side by side)."""

from configs import tiny_speedrun


def get_config():
    config = tiny_speedrun.get_config()
    # Two layers, not nanoGPT's four: half the step, and at this length the same loss sooner (docs/speedrun.md).
    # Layers stacked: Muon then orthogonalises each kind of matrix of both layers in one batched
    # Newton-Schulz iteration.
    config.model.update(n_layer=2, block_size=64, scan_layers=True)
    # More than three times the rows a step: Muon's update, the same for any batch, is paid a third as
    # often per token. Ten steps of warmup, not tiny's hundred, in a run of 150; one evaluation, at the
    # end (20 batches of 40: 800 windows, the whole validation split). The rate held after the warmup
    # and brought down in a straight line over the second half: the cosine's loss 10 steps sooner.
    config.train.update(batch_size=40, steps=150, warmup_steps=10, cooldown_steps=75)
    config.train.update(eval_every=150, checkpoint_every=150)
    # Four microbatches a core, set, not chosen: the step is as fast at 2, 3 or 4 (48 rows: 90-94 ms
    # on a Zen 4 with 32 MiB of L3; 25% slower at 1), and 4 keeps each core's temporaries near 10 MiB,
    # within smaller caches too, so the run skips compiling the step twice to choose (5 s of a fresh start).
    config.train.microbatches = 4
    # One program over both cores instead of one each: compiled once (2 s less of a fresh start, a
    # tenth of the run), and with its two scanned layers the step is as fast (docs/benchmarks.md).
    config.train.one_program_for_cores = True
    return config
