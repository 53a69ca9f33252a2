"""Prepare a config's corpus before training: python -m jaxgpt prepare --config configs/X.py

Examples:
  python -m jaxgpt prepare --config configs/tiny.py
  python -m jaxgpt prepare --config configs/gpt2_124m.py --config.data.max_tokens=0   # the whole 10B sample

Tokenizes data.source with data.tokenizer on every core into the cache train.py reads
(jaxgpt/data/prepared.py), showing documents, tokens, tokens/s and the time left where the size is
known, and prints what was prepared. Interrupted (Ctrl-C, a kill, a preempted machine), the
same command continues from the last whole shard. Needs no JAX: run it on a CPU machine, then
train where the accelerator is, with the cache copied or on shared storage (data.cache_dir).
"""

from __future__ import annotations

from absl import flags

from jaxgpt.commands import cli


def define_flags(argv: list[str], f: flags.FlagValues) -> None:
    cli.define_config_flag(f, argv)
    flags.DEFINE_bool(
        "verify", False, "Hash every token file of an existing cache (small ones always are).", flag_values=f
    )


@cli.command(
    interrupted="interrupted; rerun the same command to continue from the last whole shard",
    starts_jax=False,  # tokenizing: no backend, so no address space to reserve for one
)
def main(argv: list[str] | None = None) -> None:
    """The command's entry point (jaxgpt prepare)."""
    from jaxgpt import data
    from jaxgpt.config_files import resolve

    argv, f = cli.command_flags(argv)
    define_flags(argv, f)
    cli.parse_flags(argv, __doc__, f)
    cli.require_config(f["config"])
    config = resolve(f.config).data
    dataset = data.prepare(config, progress=True, verify=f.verify)
    train, val = len(dataset.train), len(dataset.val)
    files = len(dataset.train.shards) if isinstance(dataset.train, data.TokenShards) else 1
    print(
        f"{config.source} with {config.tokenizer}: {train + val:,} tokens ({train:,} train, {val:,} validation) "
        f"from {len(dataset.documents):,} documents in {files} token file{'s' * (files > 1)}, "
        f"under {data.cache_folder(config)}"
    )


if __name__ == "__main__":
    main()
