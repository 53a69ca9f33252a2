"""lm-evaluation-harness scoring a run through `jaxgpt serve`: its `local-completions` model, as
its users point it at any OpenAI-compatible server, tokenizing on its side with the run's
tokenizer as transformers reads it (`jaxgpt export --tokenizer_only`) and sending prompts as
token ids with echo and logprobs. On the repository's HellaSwag-format questions (a task file in
lm-eval's own format, its context jaxgpt's: ctx, else ctx_a and ctx_b), its accuracy is
`jaxgpt hellaswag`'s, and each ending's log-likelihood is the one jaxgpt's scorer computes in a
plain forward pass: float32 sums of about 50 log-probabilities, each within a few ulps of values
near 5 (the server's padded prefill and the scorer's batch sum in other orders), so within 1e-4.

lm-eval pulls torch and a long list of its own, so it lives in an environment of its own
(requirements-eval.txt; CI runs this file there); elsewhere this file skips in one line."""

import os
import queue
import subprocess
import sys
import threading

import numpy as np
import pytest
from conftest import ROOT, small_run_config

lm_eval = pytest.importorskip(
    "lm_eval", reason="lm-eval lives in an environment of its own: pip install -r requirements-eval.txt"
)

QUESTIONS = ROOT / "tests" / "data" / "hellaswag_sample.jsonl"

TASK = """task: jaxgpt_hellaswag_sample
dataset_path: json
dataset_kwargs:
  data_files:
    test: {questions}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{ctx or (ctx_a ~ ' ' ~ ctx_b)}}}}"
doc_to_target: "{{{{label}}}}"
doc_to_choice: "{{{{endings}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory):
    """A small run on the byte vocabulary (every question's text encodes), trained 20 steps."""
    from jaxgpt.job.trainer import train_and_evaluate

    config = small_run_config(steps=20, eval_every=20, checkpoint_every=20, eval_batches=1)
    config.model.block_size = 256  # no question is cut
    config.data.tokenizer = "byte"
    workdir = tmp_path_factory.mktemp("lm-eval") / "bytes"
    train_and_evaluate(config, workdir, progress=False)
    return workdir


def test_lm_eval_scores_the_served_run_as_jaxgpts_own_scorer_does(byte_run, tmp_path):
    from jaxgpt.commands import export
    from jaxgpt.job.checkpoint import load_latest
    from jaxgpt.lab import multiple_choice

    export.main(["--workdir", str(byte_run), "--out", str(tmp_path / "tokenizer"), "--tokenizer_only"])
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "jaxgpt_hellaswag_sample.yaml").write_text(TASK.format(questions=QUESTIONS))
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "jaxgpt", "serve", "--workdir", str(byte_run), "--port", "0", "--slots", "4"]
    server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in server.stdout], daemon=True).start()
    try:
        url = lines.get(timeout=120).split(" at ", 1)[1].split()[0]
        model_args = {
            "model": "bytes", "base_url": f"{url}/v1/completions", "tokenizer": str(tmp_path / "tokenizer"),
            "tokenizer_backend": "huggingface", "num_concurrent": 2, "max_retries": 1,
        }  # fmt: skip
        results = lm_eval.simple_evaluate(
            model="local-completions", model_args=model_args, tasks=["jaxgpt_hellaswag_sample"],
            task_manager=lm_eval.tasks.TaskManager(include_path=str(tmp_path / "tasks")), log_samples=True,
        )  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=30)
    samples = sorted(results["samples"]["jaxgpt_hellaswag_sample"], key=lambda s: s["doc_id"])
    harness = [[resp[0][0] for resp in sample["resps"]] for sample in samples]

    questions = multiple_choice.read_questions(str(QUESTIONS))
    run, params, tokenizer, _ = load_latest(byte_run)
    encoded = [multiple_choice.encode(q, tokenizer, run.model.block_size) for q in questions]
    ours = multiple_choice.ending_log_probs(run.model, params, encoded)
    np.testing.assert_allclose(np.asarray(harness, np.float64), np.stack(ours), rtol=0, atol=1e-4)
    score = multiple_choice.score(run.model, params, tokenizer, questions)
    assert results["results"]["jaxgpt_hellaswag_sample"]["acc,none"] == pytest.approx(score.accuracy, abs=1e-12)
    printed = subprocess.run(
        [sys.executable, "-m", "jaxgpt", "hellaswag", "--workdir", str(byte_run), "--questions", str(QUESTIONS)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert f"accuracy {score.accuracy:.4f}," in printed.stdout, printed.stdout + printed.stderr
