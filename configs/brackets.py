"""Sequence classification: does a string of brackets balance? builtin:brackets's 20,000 strings
of 4 to 24 brackets, half "balanced", half one bracket away from it, classified by a small
decoder reading each string's last token (model.objective=classification: a classifier in the
LM head's place; jaxgpt/data/labels.py). No one position tells: the model must count. Its
evaluations report val_accuracy and the confusion matrix. The encoder's way, reading the
string from both sides at its first token as BERT's [CLS] does:

    python train.py --config configs/brackets.py --config.model.causal=false
"""

from configs import tiny


def get_config():
    config = tiny.get_config()
    config.data.source = "builtin:brackets"
    config.model.objective = "classification"
    config.model.block_size = 64  # two or more strings packed into a row, each its own segment
    config.model.position = "rope"
    config.train.steps = 1000
    config.train.warmup_steps = 50
    config.train.eval_every = 250
    return config
