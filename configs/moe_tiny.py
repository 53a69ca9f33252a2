"""configs/tiny.py with a mixture of experts in every block: 8 experts of half the MLP's width,
each token routed to 2 of them, so a token uses as many MLP parameters as tiny's dense MLP
(2 x 256 hidden units against 512) while the layer holds four times as many. Each expert takes
at most 1.25 times its even share of a sequence's tokens (Switch Transformer's capacity); the rest
are dropped and carried on by the residual."""

from configs import tiny


def get_config():
    config = tiny.get_config()
    config.model.moe.update(experts=8, top_k=2, expert_hidden=256, capacity_factor=1.25)
    return config
