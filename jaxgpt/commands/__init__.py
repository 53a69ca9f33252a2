"""What a user runs: one module per command (train, sample, check with its pre-flight checks,
compare, prepare, evaluate, plot, attention_maps, logit_lens, hellaswag), the flag parsing they
share (cli), and the one entry point that finds them by name (dispatch)."""
