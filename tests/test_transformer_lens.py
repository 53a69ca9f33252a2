"""TransformerLens as a second opinion: a model trained here, exported (`jaxgpt export`), loaded
into TransformerLens 4.x's TransformerBridge as Hugging Face's GPT-2 (its own code, without the
compatibility mode that folds the norms into the weights), reads the same prompt as jaxgpt's
capture: the residual stream before the first block and after each, every head's attention
pattern and the logits agree within 1e-4 (float32 on both sides, summed in other orders).

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
