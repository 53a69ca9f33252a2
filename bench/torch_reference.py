"""The PyTorch baseline the training benchmark compares against, written for this project.

It is nanoGPT's model and training step (Karpathy, github.com/karpathy/nanoGPT) rebuilt from
its description, not copied: a GPT-2 block (pre-LayerNorm, fused QKV projection with biases,
PyTorch's scaled_dot_product_attention with a causal mask, exact-erf GELU MLP 4x wide), tied
token embedding and LM head, learned positions; AdamW with gradient clipping at 1.0. Timing
it here, in the same run as jaxgpt, is what makes the "x nanoGPT" ratios in the suite's table
side-by-side measurements rather than figures from another day.

Two measurements: the bare step (synthetic batches, median of repeats after warmup), and with
--loop DATA the whole loop as nanoGPT's train.py runs it: each iteration draws a batch from the
memory-mapped token file, steps, and moves the loss to the host (loss.item()); every
--eval_every iterations it evaluates --eval_batches batches of val and train, every
--checkpoint_every it saves model and optimizer with torch.save.

Run alone: python bench/torch_reference.py --layers 4 --heads 4 --width 128 --seq 64 --batch 12
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm_1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.norm_2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.norm_1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, seq, width))
        return x + self.down(F.gelu(self.up(self.norm_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, seq: int, layers: int, heads: int, width: int):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, width)
        self.position_embedding = nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.token_embedding.weight
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1])
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def measure(
    layers: int,
    heads: int,
    width: int,
    seq: int,
    batch: int,
    vocab: int,
    steps: int,
    repeats: int,
    compile: bool,
    dtype: str = "float32",
) -> dict:
    torch.manual_seed(0)
    model = GPT(vocab, seq, layers, heads, width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)

    forward = torch.compile(model) if compile else model  # nanoGPT compiles the model, not the step

    # nanoGPT's train.py on a bfloat16 machine: the forward pass under autocast, the backward
    # outside it (autocast records each op's dtype for it), parameters and AdamW in float32
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")

    def step(tokens, targets):
        with autocast:
            loss = forward(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    windows = [torch.randint(0, vocab, (batch, seq + 1)) for _ in range(4)]
    start = time.perf_counter()
    for i in range(3):  # warmup; with torch.compile the first call compiles
        step(windows[i][:, :-1], windows[i][:, 1:])
    warmup_sec = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(steps):
            w = windows[i % 4]
            loss = step(w[:, :-1], w[:, 1:])
        loss.item()
        times.append((time.perf_counter() - start) / steps)
    step_sec = statistics.median(times)
    return {
        "step_ms": 1000 * step_sec,
        "tokens_per_sec": batch * seq / step_sec,
        "warmup_sec": warmup_sec,
        "threads": torch.get_num_threads(),
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "torch": torch.__version__,
        "dtype": dtype,
    }


def measure_loop(
    layers: int,
    heads: int,
    width: int,
    seq: int,
    batch: int,
    vocab: int,
    data: str,
    steps: int,
    eval_every: int,
    eval_batches: int,
    checkpoint_every: int,
) -> dict:
    """nanoGPT's training loop, timed end to end (steps after 3 warmup iterations)."""
    torch.manual_seed(0)
    model = GPT(vocab, seq, layers, heads, width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    tokens = np.memmap(data, dtype=np.uint16, mode="r")
    split = int(len(tokens) * 0.9)

    def get_batch(part: str):
        source = tokens[:split] if part == "train" else tokens[split:]
        starts = torch.randint(len(source) - seq - 1, (batch,))
        x = torch.stack([torch.from_numpy(source[i : i + seq].astype(np.int64)) for i in starts])
        y = torch.stack([torch.from_numpy(source[i + 1 : i + 1 + seq].astype(np.int64)) for i in starts])
        return x, y

    def iteration():
        loss = model(*get_batch("train"))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    for _ in range(3):
        iteration()
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        for it in range(1, steps + 1):
            iteration()
            if it % eval_every == 0:
                model.eval()
                with torch.no_grad():
                    for part in ("val", "train"):
                        sum(model(*get_batch(part)).item() for _ in range(eval_batches))
                model.train()
            if it % checkpoint_every == 0:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, Path(out) / "ckpt.pt")
        seconds = time.perf_counter() - start
    return {"loop_sec": seconds, "tokens_per_sec": steps * batch * seq / seconds, "torch": torch.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("layers", 4), ("heads", 4), ("width", 128), ("seq", 64), ("batch", 12), ("vocab", 96)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compile", action="store_true", help="torch.compile the step")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="bfloat16: the forward pass under torch.autocast('cpu', torch.bfloat16)",
    )
    parser.add_argument("--loop", metavar="DATA", help="time nanoGPT's whole loop over this uint16 token file")
    parser.add_argument("--eval_every", type=int, default=250)
    parser.add_argument("--eval_batches", type=int, default=20)
    parser.add_argument("--checkpoint_every", type=int, default=500)
    args = parser.parse_args()
    if args.loop:
        shape = (args.layers, args.heads, args.width, args.seq, args.batch, args.vocab)
        cadence = (args.eval_every, args.eval_batches, args.checkpoint_every)
        print(json.dumps(measure_loop(*shape, args.loop, args.steps, *cadence)))
        return
    result = measure(
        args.layers,
        args.heads,
        args.width,
        args.seq,
        args.batch,
        args.vocab,
        args.steps,
        args.repeats,
        args.compile,
        args.dtype,
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
