"""Name every architectural choice of a model: python -m jaxgpt inspect --init_from DIR | --workdir RUN

Examples:
  python -m jaxgpt inspect --workdir runs/tiny
  python -m jaxgpt inspect --init_from path/to/a/hugging-face/folder
  python -m jaxgpt inspect --init_from gpt2

The texts' exercise: read a real model's config and name every choice. One row a choice, by the
texts' names and beside the line of docs/model.md that explains it: the blocks and their width,
the norm and where it sits, the heads (query, key/value, their width: multi-head, grouped- or
multi-query), the positions (RoPE's base and scaling, a learned table), the MLP (its activation
and width, or the experts), the biases, whether the embeddings are tied, the vocabulary; then
every switch the model turns on beyond GPT-2's, and the parameters by part (embeddings,
attention, MLP, norms, head). A Hugging Face folder is read through its converter, so a choice
the converter does not know is refused in one line naming it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax

from jaxgpt.commands import cli, inspected
from jaxgpt.config import ModelConfig
from jaxgpt.config.model import fields_of_kind

DOCS = Path(__file__).resolve().parents[2] / "docs" / "model.md"
GPT2 = ModelConfig()  # the defaults: a switch is "on" where a model differs from them


@functools.cache
def docs_lines() -> tuple[str, ...]:
    """docs/model.md's lines, read once; none where the docs are not beside the package (an
    installed wheel)."""
    return tuple(DOCS.read_text().splitlines()) if DOCS.is_file() else ()


def docs_line(anchor: str) -> str:
    """docs/model.md:N, N the first line holding `anchor` (a heading's or a table row's text),
    or the page's name alone where it is not found."""
    number = next((n for n, line in enumerate(docs_lines(), 1) if anchor in line), None)
    return f"docs/model.md:{number}" if number else "docs/model.md"


def switch_anchor(field: str) -> str:
    """Where docs/model.md's tables name a switch: the field, set (`qk_norm=True`)."""
    return f"`{field}="


def heads(c: ModelConfig) -> str:
    if c.token_mixer != "attention":
        return "none: a convolution mixes the positions (token_mixer)"
    kind = "multi-head" if c.n_kv_head == c.n_head else "multi-query" if c.n_kv_head == 1 else "grouped-query"
    group = f", {c.group_size} queries a key/value head" if kind == "grouped-query" else ""
    return f"{c.n_head} query, {c.n_kv_head} key/value ({kind}{group}), head_dim {c.head_dim}"


def positions(c: ModelConfig) -> str:
    if c.position == "rope":
        scaling = f", scaling {c.rope_scaling.kind} x{c.rope_scaling.factor:g}" if c.rope_scaling else ""
        return f"rope, theta {c.rope_theta:g}, {c.rope_pairing} pairing{scaling}"
    if c.position == "learned":
        return f"learned, a table of {c.block_size}"
    return {"sinusoidal": "sinusoidal", "alibi": "alibi (a bias per head on the scores)"}.get(
        c.position, "none (the causal mask alone carries order)"
    )


def mlp(c: ModelConfig) -> tuple[str, str]:
    if not c.mlp:
        return "none (attention-only blocks)", switch_anchor("mlp")
    if c.moe is not None:
        m = c.moe
        shared = f", {m.shared_experts} shared" if m.shared_experts else ""
        return f"{m.experts} experts of {c.expert_hidden}, top-{m.top_k}{shared}, {c.activation}", "| `moe.py` |"
    return f"{c.activation}, hidden {c.mlp_hidden} ({c.mlp_hidden / c.d_model:g} x d_model)", "| `layers.py` |"


def choices(c: ModelConfig) -> list[tuple[str, str, str]]:
    """(choice, its value in this model, the docs' anchor) for each architectural choice."""
    encoder = f", behind an encoder of {c.encoder_layers}" if c.encoder_layers else ""
    norm = "no norms" if c.norm == "none" else f"{c.norm}, eps {c.norm_eps:g}"
    biases = "on" if c.bias else "off" + (", but on the query, key and value (qkv_bias)" if c.qkv_bias else "")
    tied = "tied: the LM head reads the token embedding" if c.tie_embeddings else "untied: a head of its own"
    rows = [
        ("blocks", f"{c.n_layer}, d_model {c.d_model}{encoder}", "- **Blocks.**"),
        ("norm", f"{norm}, {c.norm_position}-norm", "- **Blocks.**"),
        ("heads", heads(c), "- **Attention.**"),
        ("positions", positions(c), "- **Positions.**"),
        ("context", f"block_size {c.block_size}", "- **KV cache.**"),
        ("MLP", *mlp(c)),
        ("biases", biases, "- **Initialisation.**"),
        ("embeddings", tied, "- **Initialisation.**"),
        ("vocabulary", f"{c.vocab_size} tokens", "| `tokenizers.py` |"),
        (
            "objective",
            c.objective,
            "## Adding an objective" if c.objective == "next_token" else f'`objective="{c.objective}"`',
        ),
    ]
    if c.attention_scale_dim is not None:
        rows.append(("attention_scale_dim", str(c.attention_scale_dim), switch_anchor("attention_scale_dim")))
    switches = [f for f in fields_of_kind("workbench") if getattr(c, f) != getattr(GPT2, f)]
    return rows + [(field, str(getattr(c, field)), switch_anchor(field)) for field in switches]


PARTS = (  # a parameter's part, by the first name on its path that says (else "other")
    ("embeddings", ("wte", "wpe", "value_embed", "patch_embed")),
    ("attention", ("attn", "cross", "conv")),
    ("MLP", ("mlp", "moe")),
    ("head", ("lm_head", "head_dense", "head_bias", "classifier", "mtp")),
)


def parameters_by_part(params) -> dict[str, int]:
    counts = dict.fromkeys([name for name, _ in PARTS] + ["norms", "other"], 0)
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        names = [str(getattr(k, "key", k)) for k in path]
        part = next((name for name, keys in PARTS if any(n in keys for n in names)), None)
        if part is None:
            part = "norms" if any("norm" in n for n in names) else "other"
        counts[part] += int(leaf.size)
    return {part: n for part, n in counts.items() if n}


def report(c: ModelConfig, params, source: str) -> list[str]:
    counts = parameters_by_part(params)
    parts = ", ".join(f"{part} {n:,}" for part, n in counts.items())
    rows = choices(c) + [("parameters", f"{sum(counts.values()):,}: {parts}", "| `transformer.py` |")]
    width = max(len(what) for what, _, _ in rows)
    value_width = max(len(value) for _, value, _ in rows)
    lines = [f"{source}: a {c.n_layer}-layer {'decoder' if c.causal else 'encoder'}, the choices it makes"]
    lines += [f"  {what:<{width}}  {value:<{value_width}}  {docs_line(anchor)}" for what, value, anchor in rows]
    return lines


@cli.command()
def main(argv: list[str] | None = None) -> None:
    """The command's entry point: bad input exits 2 with one line."""
    f = inspected.parse_flags(argv, __doc__, lambda _: None, prompt=False)
    if f.init_from and not (f.init or f.step is not None):  # the weights alone: a folder's tokenizer is not asked for
        from jaxgpt.hf import load_pretrained

        config, params, _ = load_pretrained(f.init_from)
        source = "Hugging Face weights"
    else:
        config, params, _, source = inspected.load_model(f)
    print("\n".join(report(config, params, f"{f.init_from or f.workdir} ({source})")))


if __name__ == "__main__":
    main()
