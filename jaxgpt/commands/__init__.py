"""What a user runs: train, sample, check (with its pre-flight checks), compare, plot and
attention_maps, and the flag parsing they share (cli). `python -m jaxgpt.check` and the other
documented names are two-line modules at the package's top that run these."""
