"""Supervised fine-tuning to chat (docs/lab.md "From a base model to one that answers"): the base
model configs/arithmetic.py trained (train.init_from=runs/arithmetic) learns the chat template
from builtin:arithmetic-chat's conversations, sums asked and answered, the loss on the
assistant's turns alone (data.loss_on). Its four special tokens are added to the byte
vocabulary, the embedding grown by a row each. val_exact_match is the held-out conversations
whose every answer greedy decoding writes exactly.

    python train.py --config configs/arithmetic.py --workdir runs/arithmetic
    python train.py --config configs/sft_arithmetic.py --workdir runs/sft_arithmetic
    python -m jaxgpt chat --workdir runs/sft_arithmetic

--config.train.init_from= trains the same model from scratch on the conversations alone;
--config.data.loss_on=all scores every token of them, the user's too; --config.model.lora_rank=8
trains low-rank adapters and the token embedding (model.lora_embeddings, set here: the template's
new tokens must be learned) with the rest frozen."""

from configs import arithmetic


def get_config():
    config = arithmetic.get_config()
    config.data.source = "builtin:arithmetic-chat"
    config.train.init_from = "runs/arithmetic"
    config.model.lora_embeddings = True  # with --config.model.lora_rank=R: the template's tokens learned
    config.train.steps = 1000
    config.train.lr = 2e-3
    config.train.min_lr = 2e-4
    config.train.warmup_steps = 50
    config.train.eval_every = 250
    config.train.eval_batches = 80  # every held-out conversation (2,037, about 1.7 a row): the accuracy is of all
    config.train.checkpoint_every = 500
    return config
