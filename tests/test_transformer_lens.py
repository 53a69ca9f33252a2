"""TransformerLens as a second opinion: a model trained here, exported (`jaxgpt export`), loaded
into TransformerLens 4.x's TransformerBridge as Hugging Face's GPT-2 (its own code, without the
compatibility mode that folds the norms into the weights), reads the same prompt as jaxgpt's
capture: the residual stream before the first block and after each, every head's attention
pattern and the logits agree within 1e-4 (float32 on both sides, summed in other orders); so does
every named activation site the two share (jaxgpt/lab/activations.py), and activation patching
done with TransformerLens's own hooks gives jaxgpt's patching table within 1e-3.

Optional, in an environment of its own (requirements-lens.txt: TransformerLens pins its own
transformers); elsewhere the file skips in one line."""

import numpy as np
import pytest

transformer_lens = pytest.importorskip(
    "transformer_lens.model_bridge", reason="TransformerLens is not installed: pip install -r requirements-lens.txt"
)
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def both(trained_small_run, tmp_path_factory):
    """(jaxgpt's capture, TransformerLens's cache and logits) of one prompt, from one run."""
    from jaxgpt.commands import export
    from jaxgpt.job.checkpoint import load_latest
    from jaxgpt.lab.capture import capture

    out = tmp_path_factory.mktemp("lens") / "exported"
    export.main(["--workdir", str(trained_small_run), "--out", str(out)])
    run, params, tokenizer, _ = load_latest(trained_small_run)
    ids = np.asarray([tokenizer.encode("def f(x):\n    return x + 1")])
    ours = capture(run.model, params, ids)
    bridge = transformer_lens.TransformerBridge.boot_transformers(str(out), device="cpu")
    logits, cache = bridge.run_with_cache(torch.tensor(ids))
    return run.model, ours, cache, logits.detach().numpy()


def theirs(cache, name: str) -> np.ndarray:
    return cache[name].detach().numpy()


def test_the_residual_stream_is_transformer_lens_s_after_every_block(both):
    config, ours, cache, _ = both
    stream = [theirs(cache, "blocks.0.hook_resid_pre")]
    stream += [theirs(cache, f"blocks.{layer}.hook_resid_post") for layer in range(config.n_layer)]
    np.testing.assert_allclose(np.asarray(ours.residual), np.stack(stream), atol=1e-4)


def test_every_heads_pattern_is_transformer_lens_s(both):
    config, ours, cache, _ = both
    patterns = np.stack([theirs(cache, f"blocks.{layer}.attn.hook_pattern") for layer in range(config.n_layer)])
    np.testing.assert_allclose(np.asarray(ours.weights), patterns, atol=1e-4)  # (layer, batch, head, query, key)


def test_the_logits_are_transformer_lens_s(both):
    _, ours, _, logits = both
    np.testing.assert_allclose(np.asarray(ours.logit_lens[-1]), logits, atol=1e-4)  # the last readout is the model's


def test_every_named_site_is_transformer_lens_s(both, trained_small_run):
    """By name, the whole table: embeddings, the stream, q/k/v, scores (masked in the same places),
    pattern, each head's z, attn_out, the MLP's pre/post/out, the final norm's output."""
    from jaxgpt.job.checkpoint import load_latest
    from jaxgpt.lab import activations

    config, _, cache, _ = both
    run, params, tokenizer, _ = load_latest(trained_small_run)
    ids = np.asarray([tokenizer.encode("def f(x):\n    return x + 1")])
    names = list(activations.site_shapes(config, ids))
    assert len(names) == 2 + 13 * config.n_layer + 1 and all(name in cache for name in names), names
    _, ours = activations.run_with_cache(config, params, ids, names)
    for name in names:
        mine, its = np.asarray(ours[name]), theirs(cache, name)
        seen = np.isfinite(mine)  # a masked score: -inf here, float32's lowest in TransformerLens
        assert np.all(its[~seen] <= np.finfo(np.float32).min / 2), name
        np.testing.assert_allclose(mine[seen], its[seen], atol=1e-4, err_msg=name)


def test_activation_patching_with_transformer_lens_s_hooks_gives_jaxgpt_s_table(trained_small_run, tmp_path):
    """The patching loop as TransformerLens users write it (run_with_hooks, a hook copying one
    clean activation in), against jaxgpt's one compiled sweep. A 20-step model's logit
    difference moves 0.05 between these prompts: float32 noise of 1e-7 becomes 2e-6 of it."""
    from jaxgpt.commands import export
    from jaxgpt.job.checkpoint import load_latest
    from jaxgpt.lab import patching

    out = tmp_path / "exported"
    export.main(["--workdir", str(trained_small_run), "--out", str(out)])
    run, params, tokenizer, _ = load_latest(trained_small_run)
    clean, corrupted = tokenizer.encode("def f(x): return x +"), tokenizer.encode("def f(x): return x -")
    answer, wrong = tokenizer.encode(" ")[0], tokenizer.encode("=")[0]
    ours = patching.activation_patching(run.model, params, patching.prompt_pair(clean, corrupted, answer, wrong))
    bridge = transformer_lens.TransformerBridge.boot_transformers(str(out), device="cpu")
    clean_ids, corrupted_ids = torch.tensor([clean]), torch.tensor([corrupted])
    _, clean_cache = bridge.run_with_cache(clean_ids)

    def difference(logits):
        return (logits[0, -1, answer] - logits[0, -1, wrong]).item()

    clean_diff, corrupted_diff = difference(bridge(clean_ids)), difference(bridge(corrupted_ids))
    assert abs(clean_diff - corrupted_diff) > 0.04
    for kind, values in ours.restored.items():
        site, axis = patching.SWEEPS[kind]
        table = np.zeros_like(values)
        for layer, index in np.ndindex(values.shape):
            name = f"blocks.{layer}.{site}"

            def patch(activation, hook, name=name, index=index, axis=axis):
                activation = activation.clone()
                where = (slice(None), index) if axis == "position" else (slice(None), slice(None), index)
                activation[where] = clean_cache[name][where]
                return activation

            patched = difference(bridge.run_with_hooks(corrupted_ids, fwd_hooks=[(name, patch)]))
            table[layer, index] = (patched - corrupted_diff) / (clean_diff - corrupted_diff)
        np.testing.assert_allclose(values, table, atol=1e-3, err_msg=kind)
