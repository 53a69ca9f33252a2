"""What a user runs: one module per command (train, sample, check with its pre-flight checks,
compare, prepare, evaluate, plot, attention_maps, logit_lens, fill, hellaswag, export; seq2seq
only says where it went), the flag parsing they
share (cli), and the one entry point that finds them by name (dispatch)."""
