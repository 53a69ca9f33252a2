"""Learning from rewards: how fast answers are sampled, and how a step divides between sampling
and updating.

    python bench/rollout.py [--config configs/rl_arithmetic.py] [--config.train.rl.prompts=16 ...]
        [--steps 20] [--out bench/results/rollout.json]

The run is the config's (train.init_from's weights where that folder exists, else a fresh
initialisation of the same shape, which rarely ends an answer before train.rl.max_tokens and so
samples every token it may: the table says which). Two tables:

1. Sampling alone (jaxgpt/data/rollouts.py `rollout`, on the run's own mesh): each of the first
   --steps steps' prompts (train.rl.draws of them, or train.rl.prompts) answered train.rl.samples
   times, once with one decoding call a prompt and once with every row in one call (what training
   does: `answer_each`, the prompts padded to one length), after a first pass over the same steps
   that compiled both. Sampled tokens are the answers' own, up to and with their end of turn.
2. A step of training (train.py's engine, `train_and_evaluate`, logging every step): the seconds
   of a step spent sampling (the rollout's, measured after the previous update finished) and the
   rest (the update, and the host's scoring), medians over the steps after the first two.

The CPU is named in the table and the JSON; compile time is excluded from both tables.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from absl import flags  # noqa: E402

from jaxgpt.commands import cli  # noqa: E402  (imports jax without starting it)

CONFIG = cli.define_config_flag()
STEPS = flags.DEFINE_integer("steps", 20, "steps sampled (table 1) and trained (table 2)")
OUT = flags.DEFINE_string("out", "bench/results/rollout.json", "JSON to write")


def sampling_rates(run, dataset, params, steps: int, say) -> list[dict]:
    """Table 1: sampled tokens/s of `steps` rollouts, one call a prompt against answer_each's."""
    from jaxgpt import data, sharding

    rollouts, _ = data.batch_sources(dataset, run)
    mesh = sharding.make_mesh(run.mesh)
    rl, rows = run.train.rl, []
    say(f"{'decoding calls':>34} {'seconds a rollout':>17} {'sampled tokens/s':>16}")
    drawn = rl.draws or rl.prompts
    ways = (("one a prompt", rl.samples), ("every row at once (training's)", drawn * rl.samples))
    for name, rows_a_call in ways:
        rollouts.rows_a_call = rows_a_call
        for step in range(steps):  # compiled, and the answers' lengths the same in the timed pass
            rollouts.rollout(params, step, mesh)
        rollouts.said = []
        started = time.perf_counter()
        for step in range(steps):
            rollouts.rollout(params, step, mesh)
        seconds = time.perf_counter() - started
        tokens = sum(s["answer_tokens"] * drawn * rl.samples for s in rollouts.said)
        row = dict(calls=name, rows_a_call=rows_a_call, seconds_a_rollout=seconds / steps)
        rows.append(row | dict(sampled_tokens_per_sec=tokens / seconds, answer_tokens=tokens / steps))
        say(f"{name:>34} {row['seconds_a_rollout']:>17.3f} {rows[-1]['sampled_tokens_per_sec']:>16,.0f}")
    return rows


def step_shares(config, steps: int, say) -> dict:
    """Table 2: a step of the engine, sampling against the rest, medians after the first two."""
    from jaxgpt.job.trainer import train_and_evaluate

    config.train.update(steps=steps, log_every=1, eval_every=steps, checkpoint_every=steps, warmup_steps=1)
    with tempfile.TemporaryDirectory() as workdir:
        train_and_evaluate(config, workdir, progress=False)
        records = [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
    row_length = config.train.rl.length or config.model.block_size  # RunConfig.row_length
    tokens_per_step = config.train.rl.prompts * config.train.rl.samples * row_length
    later = [r for r in records if r["step"] > 2]
    step_sec = statistics.median(tokens_per_step / r["tokens_per_sec"] for r in later)
    sampling_sec = statistics.median(r["rl_sampling_sec"] for r in later)
    row = dict(step_sec=step_sec, sampling_sec=sampling_sec, sampling_share=sampling_sec / step_sec)
    row["sampled_tokens_per_sec"] = statistics.median(r["rl_sampled_tokens_per_sec"] for r in later)
    say(f"{'step s':>8} {'sampling s':>10} {'the rest s':>10} {'sampling share':>14} {'sampled tokens/s':>16}")
    say(
        f"{step_sec:>8.3f} {sampling_sec:>10.3f} {step_sec - sampling_sec:>10.3f} {row['sampling_share']:>14.0%} "
        f"{row['sampled_tokens_per_sec']:>16,.0f}"
    )
    return row


def shipped(name: str):
    """A shipped config's ConfigDict, for when no --config is given."""
    import runpy

    return runpy.run_path(cli.shipped_config(f"configs/{name}.py"))["get_config"]()


def main() -> None:
    cli.parse_flags(sys.argv, usage=__doc__)
    from jaxgpt.hardware import runtime

    runtime.enable_compilation_cache()
    import jax

    from jaxgpt import data
    from jaxgpt.config_files import resolve
    from jaxgpt.hardware.peak_flops import cpu_model
    from jaxgpt.job.setup import with_vocabulary
    from jaxgpt.model.transformer import init_params

    config = CONFIG.value if CONFIG.value is not None else shipped("rl_arithmetic")
    weights = config.train.init_from
    if weights and not Path(weights).exists():
        config.train.init_from = ""
    run = resolve(config, vocab_size=data.vocab_size_for(config))
    dataset = data.prepare(run.data, progress=False)
    run = with_vocabulary(run, dataset.tokenizer)
    if config.train.init_from:
        from jaxgpt.job.checkpoint import load_latest

        params, origin = load_latest(Path(weights))[1], f"the weights of {weights}"
    else:
        params, origin = init_params(run.model, jax.random.key(0)), "a fresh initialisation (no answer ends early)"
    device = jax.devices()[0]
    machine = cpu_model() if device.platform == "cpu" else device.device_kind
    rl, model = run.train.rl, run.model
    print(
        f"{machine}; {len(jax.devices())} device(s); model {model.n_layer} layers x {model.d_model} wide, "
        f"{rl.draws or rl.prompts} prompts x {rl.samples} answers of up to {rl.max_tokens} tokens a step, "
        f"{rl.prompts} of the groups trained; {origin}"
    )
    result = dict(machine=machine, devices=len(jax.devices()), config=run.to_dict(), weights=origin)
    result["sampling"] = sampling_rates(run, dataset, params, STEPS.value, print)
    result["step"] = step_shares(config, STEPS.value, print)
    Path(OUT.value).parent.mkdir(parents=True, exist_ok=True)
    Path(OUT.value).write_text(json.dumps(result, indent=2))
    print(f"wrote {OUT.value}")


if __name__ == "__main__":
    main()
