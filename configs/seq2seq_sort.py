"""configs/seq2seq_reverse.py's encoder–decoder learning to sort strings of 4 to 12 digits
("31415" -> "11345"): each output digit depends on the whole source, so no single source
position answers it, and the cross-attention spreads out. Twice the steps reversal takes."""

from configs import seq2seq_reverse


def get_config():
    config = seq2seq_reverse.get_config()
    config.data.source = "builtin:sort"
    config.train.steps = 1200
    config.train.eval_every = 400
    config.train.checkpoint_every = 600
    return config
