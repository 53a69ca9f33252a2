"""The benchmark suite: every speed figure the project quotes, in one command and one table.

    python bench/suite.py [--rounds 3] [--skip_torch] [--out bench/results/suite.json]

On the backend JAX finds (CPU here; GPU or TPU where present) it measures, each in a fresh
process so that nothing one measurement compiles or allocates helps another:
  training   the bare step: tokens/s, step time, MFU, step memory and process peak RSS for
             each case, as train.py runs it (one program per CPU core, microbatches chosen by
             the run), on one CPU device (JAXGPT_CPU_CORES=1, the previous default), and
             untuned (one device, no remat, one microbatch), beside
             the PyTorch reference (bench/torch_reference.py, nanoGPT's model and step;
             eager, and torch.compile for the first case), and on CPU the ceiling: the case's
             matmuls alone, split over the cores (bench/matmul_roofline.py);
  loops      the whole loop: train.py as a user runs it (data, step, metrics, eval and
             checkpoint cadence) against nanoGPT's loop in PyTorch (a batch from the
             memory-mapped token file, the step, loss.item(), the same cadence);
  compile    XLA compile time of the tiny train step cold and warm from the persistent
             cache, and with scan_layers at 2 and 12 layers (unrolled alongside);
  decode     cached greedy generation, tokens/s at batch 1 and 8.
Variants of a case run interleaved, `--rounds` times, and the table shows medians: timings on
a shared 2-core machine drift by 20% over minutes, so only side-by-side ratios are trusted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


@dataclass(frozen=True)
class Case:
    name: str
    config: str
    overrides: tuple[str, ...] = ()
    torch_shape: tuple[int, int, int, int, int] | None = None  # layers, heads, width, seq, batch
    torch_compile: bool = False
    vocab: int = 96
    steps: int = 20
    repeats: int = 5
    baseline: tuple[str, ...] = field(default=("model.remat=none", "train.microbatches=1"))  # undoes the CPU tuning


CPU_CASES = (
    Case(
        "tiny: 4L/4H/128d, T=64, B=12",
        "configs/tiny.py",
        ("model.block_size=64",),
        (4, 4, 128, 64, 12),
        torch_compile=True,
    ),
    Case("configs/tiny.py: T=128, B=12", "configs/tiny.py", (), (4, 4, 128, 128, 12)),
    Case(
        "6L/6H/384d, T=256, B=16",
        "configs/shakespeare_char.py",
        ("train.batch_size=16", "model.dropout=0.0"),
        (6, 6, 384, 256, 16),
        steps=4,
        repeats=3,
    ),
)
ACCELERATOR_CASES = (
    Case(
        "GPT-2 124M, T=1024, B=16, bf16",
        "configs/gpt2_124m.py",
        ("train.batch_size=16", "train.microbatches=1"),
        vocab=50304,
        steps=10,
        repeats=3,
        baseline=(),
    ),
)


def run_json(command: list[str], env: dict | None = None) -> dict:
    """Run a worker and return the JSON object on its last stdout line."""
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    if result.returncode != 0:
        raise SystemExit(f"error: {' '.join(command[1:3])} failed:\n{result.stderr.strip()[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    env.update(extra)
    return env


def jaxgpt_train(case: Case, devices: str, extra: tuple[str, ...] = ()) -> dict:
    command = [sys.executable, str(BENCH / "train_throughput.py"), "--config", case.config, "--vocab", str(case.vocab)]
    command += ["--devices", devices, "--steps", str(case.steps), "--repeats", str(case.repeats)]
    for item in case.overrides + extra:
        command.append(f"--config.{item}")
    return run_json(command, clean_env(JAXGPT_COMPILATION_CACHE="off"))


def interleaved_variants(variants: dict[str, Case], rounds: int, out: Path, first: str) -> list[dict]:
    """Each variant's training step (bench/train_throughput.py in a fresh process), the variants
    interleaved `rounds` times; prints medians and each one's step time as a multiple of the
    first variant's (`first` names it in the table), round by round too: on a shared machine
    the ratios measured side by side are the figures to trust. Writes them to `out`."""
    from jaxgpt.hardware.peak_flops import cpu_model

    runs: dict[str, list[dict]] = {name: [] for name in variants}
    for round_ in range(rounds):
        for name, case in variants.items():
            runs[name].append(jaxgpt_train(case, "auto"))
            print(f"round {round_ + 1}/{rounds}: {name}: {runs[name][-1]['tokens_per_sec']:,.0f} tokens/s", flush=True)
    rows = []
    base_runs = next(iter(runs.values()))
    for name, results in runs.items():
        rows.append(
            {
                "variant": name,
                "step_ms": statistics.median(r["step_ms"] for r in results),
                "tokens_per_sec": statistics.median(r["tokens_per_sec"] for r in results),
                "mfu": statistics.median(r["mfu"] for r in results),
                # each round's own ratio: the machine moves
                f"vs_{first}_by_round": [r["step_ms"] / b["step_ms"] for r, b in zip(results, base_runs, strict=True)],
            }
        )
    print(f"\n{cpu_model()}; medians of {rounds} interleaved rounds")
    width = max(len(name) for name in variants)
    print(f"{'variant':{width}} {'step ms':>8} {'tokens/s':>9} {'x ' + first:>9} {'MFU':>6}")
    for row in rows:
        row[f"vs_{first}"] = row["step_ms"] / rows[0]["step_ms"]
        print(
            f"{row['variant']:{width}} {row['step_ms']:8.1f} {row['tokens_per_sec']:9,.0f} {row[f'vs_{first}']:9.2f} "
            f"{row['mfu']:6.1%}"
        )
    for row in rows[1:]:
        by_round = ", ".join(f"{r:.2f}" for r in row[f"vs_{first}_by_round"])
        print(f"{row['variant']}: x {first} round by round {by_round}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpu": cpu_model(), "rounds": rounds, "rows": rows}, indent=2))
    print(f"wrote {out}")
    return rows


def torch_train(case: Case, compile: bool) -> dict:
    layers, heads, width, seq, batch = case.torch_shape
    command = [sys.executable, str(BENCH / "torch_reference.py"), "--layers", str(layers), "--heads", str(heads)]
    command += ["--width", str(width), "--seq", str(seq), "--batch", str(batch), "--vocab", str(case.vocab)]
    command += ["--steps", str(case.steps), "--repeats", str(case.repeats)] + (["--compile"] if compile else [])
    return run_json(command, clean_env())


def matmul_ceiling(case: Case) -> dict:
    """The MFU a step made only of the case's matmuls would reach, split over the cores as
    train.py splits it (bench/matmul_roofline.py: the block's forward shapes, each timed alone;
    the backward pass is assumed to run its transposes as fast)."""
    _, heads, width, seq, batch = case.torch_shape
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "roofline.json"
        command = [sys.executable, str(BENCH / "matmul_roofline.py"), "--width", str(width), "--heads", str(heads)]
        command += ["--seq", str(seq), "--batch", str(batch), "--out", str(out)]
        result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=clean_env())
        if result.returncode != 0:
            raise SystemExit(f"error: matmul_roofline.py failed:\n{result.stderr.strip()[-2000:]}")
        roofline = json.loads(out.read_text())
    return {"mfu": roofline["block_ceiling"]["per_core"] / roofline["peak_flops"]}


def fill_in_by_flops(rows: list[dict]) -> None:
    """Give every row of one case both tokens/s and MFU: the PyTorch model does the same FLOPs
    per token as jaxgpt's (the same matmuls), and MFU is against the same peak, so the two
    convert by jaxgpt's measured ratio; step time follows from tokens/s."""
    reference = next(r for r in rows if "mfu" in r and "tokens_per_sec" in r)
    mfu_per_token_rate = reference["mfu"] / reference["tokens_per_sec"]
    tokens_per_step = reference["tokens_per_sec"] * reference["step_ms"] / 1000
    for row in rows:
        row.setdefault("mfu", row.get("tokens_per_sec", 0) * mfu_per_token_rate)
        row.setdefault("tokens_per_sec", row["mfu"] / mfu_per_token_rate)
        row.setdefault("step_ms", 1000 * tokens_per_step / row["tokens_per_sec"])


CEILING = "matmuls alone over the cores: ceiling"


def training(cases, on_cpu: bool, rounds: int, with_torch: bool, say) -> list[dict]:
    rows = []
    for case in cases:
        variants = {"jaxgpt (as train.py runs it)": lambda c=case: jaxgpt_train(c, "auto")}
        if on_cpu:
            variants["jaxgpt, one CPU device (the previous default)"] = lambda c=case: jaxgpt_train(c, "1")
            variants["jaxgpt untuned (no remat, 1 microbatch)"] = lambda c=case: jaxgpt_train(c, "1", c.baseline)
        if with_torch and case.torch_shape:
            variants["PyTorch eager (nanoGPT model)"] = lambda c=case: torch_train(c, compile=False)
            if case.torch_compile:
                variants["PyTorch torch.compile"] = lambda c=case: torch_train(c, compile=True)
        if on_cpu and case.torch_shape:
            variants[CEILING] = lambda c=case: matmul_ceiling(c)
        runs: dict[str, list[dict]] = {name: [] for name in variants}
        for round_ in range(rounds):
            for name, measure in variants.items():
                say(f"  {case.name} / {name} (round {round_ + 1} of {rounds})")
                runs[name].append(measure())
        case_rows = []
        for name, results in runs.items():
            row = {"case": case.name, "variant": name, "rounds": len(results)}
            for key in results[0]:
                values = [r[key] for r in results]
                row[key] = statistics.median(values) if isinstance(values[0], (int, float)) else values[0]
            case_rows.append(row)
        fill_in_by_flops(case_rows)
        rows += case_rows
    return rows


LOOP = {"steps": 300, "eval_every": 100, "eval_batches": 20, "checkpoint_every": 150, "log_every": 50}


def prepared_tokens() -> dict:
    """The built-in corpus's token file (char-level, uint16) and vocabulary, as train.py
    prepares it: what both loops read."""
    code = (
        "import json; from jaxgpt import data; from jaxgpt.config import DataConfig; "
        "d = data.prepare(DataConfig(), progress=False); "
        "print(json.dumps({'path': str(d.train.filename), 'vocab': d.tokenizer.vocab_size}))"
    )
    return run_json([sys.executable, "-c", code], clean_env())


def jaxgpt_loop(case: Case) -> dict:
    """train.py itself, as a user runs it: data, step, metrics, eval and checkpoint cadence.
    Loop throughput from its own log (elapsed_sec covers every step, eval and save after
    compilation); process seconds include Python, imports and compilation."""
    with tempfile.TemporaryDirectory() as workdir:
        command = [sys.executable, "train.py", "--config", case.config, f"--workdir={workdir}", "--quiet"]
        command += [f"--config.{item}" for item in case.overrides]
        command += [f"--config.train.{k}={v}" for k, v in LOOP.items()]
        start = time.perf_counter()
        result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=clean_env())
        process_sec = time.perf_counter() - start
        if result.returncode != 0:
            raise SystemExit(f"error: train.py failed:\n{result.stderr.strip()[-2000:]}")
        records = [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    _, _, _, seq, batch = case.torch_shape
    return {"tokens_per_sec": LOOP["steps"] * batch * seq / last["elapsed_sec"], "process_sec": process_sec}


def torch_loop(case: Case, tokens: dict) -> dict:
    layers, heads, width, seq, batch = case.torch_shape
    command = [sys.executable, str(BENCH / "torch_reference.py"), "--layers", str(layers), "--heads", str(heads)]
    command += ["--width", str(width), "--seq", str(seq), "--batch", str(batch), "--vocab", str(tokens["vocab"])]
    command += ["--loop", tokens["path"], "--steps", str(LOOP["steps"])]
    command += [f"--{k}={LOOP[k]}" for k in ("eval_every", "eval_batches", "checkpoint_every")]
    start = time.perf_counter()
    out = run_json(command, clean_env())
    return out | {"process_sec": time.perf_counter() - start}


def loops(cases, rounds: int, say) -> list[dict]:
    """Whole training loops side by side: train.py against nanoGPT's loop in PyTorch."""
    tokens = prepared_tokens()
    rows = []
    for case in cases:
        if not case.torch_shape or not case.config.endswith("tiny.py"):
            continue
        runs: dict[str, list[dict]] = {"train.py": [], "PyTorch eager, nanoGPT's loop": []}
        for round_ in range(rounds):
            say(f"  {case.name} / whole loops (round {round_ + 1} of {rounds})")
            runs["train.py"].append(jaxgpt_loop(case))
            runs["PyTorch eager, nanoGPT's loop"].append(torch_loop(case, tokens))
        for name, results in runs.items():
            row = {"case": case.name, "variant": name, "rounds": len(results), "steps": LOOP["steps"]}
            row |= {k: statistics.median(r[k] for r in results) for k in ("tokens_per_sec", "process_sec")}
            rows.append(row)
    return rows


def compile_times(say) -> dict:
    def compile_seconds(overrides: tuple[str, ...], cache: str) -> dict:
        command = [sys.executable, str(BENCH / "train_throughput.py"), "--config", "configs/tiny.py", "--compile_only"]
        for item in overrides:
            command.append(f"--config.{item}")
        return run_json(command, clean_env(JAXGPT_COMPILATION_CACHE=cache))

    with tempfile.TemporaryDirectory() as cache:
        say("  compile: cold, then warm from the persistent cache")
        cold, warm = compile_seconds((), cache), compile_seconds((), cache)
    depth = {}
    for scan in (True, False):
        for layers in (2, 12):
            say(f"  compile: {layers} layers, scan_layers={scan}")
            depth[f"{'scan' if scan else 'unrolled'}_{layers}"] = compile_seconds(
                (f"model.n_layer={layers}", f"model.scan_layers={'true' if scan else 'false'}"), "off"
            )
    return {"cold": cold, "warm": warm, "depth": depth}


def decode(say) -> dict:
    say("  decode: cached greedy generation")
    return run_json(
        [sys.executable, str(BENCH / "decode.py"), "--cached_only"], clean_env(JAXGPT_COMPILATION_CACHE="off")
    )


def print_table(result: dict) -> None:
    print(f"\n{result['hardware']}; jax {result['jax']}; {result['date']}")
    peak = result["peak_flops"] / 1e9
    print(f"peak {peak:,.0f} GFLOP/s ({result['peak_source']}); medians of {result['rounds']} round(s)")
    columns = f"{'step ms':>9} {'tokens/s':>10} {'MFU':>6} {'vs eager':>9} {'temp MB':>8} {'RSS MB':>7}"
    print(f"\n{'case':32} {'variant':40} {columns}")
    eager = {r["case"]: r["tokens_per_sec"] for r in result["training"] if r["variant"].startswith("PyTorch eager")}
    for r in result["training"]:
        ratio = f"{r['tokens_per_sec'] / eager[r['case']]:.2f}x" if r["case"] in eager else "-"
        mfu = f"{r['mfu']:.1%}"
        temp = f"{r['step_temp_mb']:.0f}" if r.get("step_temp_mb") is not None else "-"
        rss = f"{r['max_rss_mb']:.0f}" if "max_rss_mb" in r else "-"
        print(
            f"{r['case']:32} {r['variant']:40} {r['step_ms']:>9.1f} {r['tokens_per_sec']:>10,.0f} {mfu:>6} "
            f"{ratio:>9} {temp:>8} {rss:>7}"
        )
    if result.get("loops"):
        print(f"\nwhole training loops, {LOOP['steps']} steps with eval and checkpoint cadence ({LOOP}):")
        torch_rate = {r["case"]: r["tokens_per_sec"] for r in result["loops"] if r["variant"].startswith("PyTorch")}
        for r in result["loops"]:
            ratio = r["tokens_per_sec"] / torch_rate[r["case"]]
            print(
                f"{r['case']:32} {r['variant']:40} {r['tokens_per_sec']:>10,.0f} tokens/s {ratio:>6.2f}x  "
                f"process {r['process_sec']:.1f} s"
            )
    c = result["compile"]
    cold, warm = c["cold"], c["warm"]
    print(
        f"\ncompile (tiny train step, XLA): cold {cold['compile_sec']:.2f} s, warm {warm['compile_sec']:.2f} s "
        f"({warm['compile_sec'] / cold['compile_sec']:.0%} of cold); tracing {cold['trace_sec']:.2f} s cold, "
        f"{warm['trace_sec']:.2f} s warm"
    )
    d = c["depth"]
    for kind in ("scan", "unrolled"):
        two, twelve = d[f"{kind}_2"]["compile_sec"], d[f"{kind}_12"]["compile_sec"]
        print(f"compile, {kind:8}: 2 layers {two:.2f} s, 12 layers {twelve:.2f} s ({twelve / two:.2f}x)")
    rates = ", ".join(f"{k} {v:,.0f} tokens/s" for k, v in result["decode"]["tokens_per_sec"].items())
    print(f"decode (tiny shape, 256 new tokens, KV cache): {rates}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="interleaved repetitions of each training variant")
    parser.add_argument("--skip_torch", action="store_true", help="leave out the PyTorch reference")
    parser.add_argument("--out", default="bench/results/suite.json")
    args = parser.parse_args()

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    probe = _probe()  # in a child process: this one never starts JAX
    on_cpu = probe["platform"] == "cpu"
    started = time.time()
    with_torch = not args.skip_torch and on_cpu
    say(f"benchmarking on {probe['device_kind']} ({probe['platform']})")
    rows = training(CPU_CASES if on_cpu else ACCELERATOR_CASES, on_cpu, args.rounds, with_torch, say)
    result = {
        "hardware": f"{probe['device_count']} x {probe['device_kind']} ({platform.machine()}, {os.cpu_count()} cores)"
        if not on_cpu
        else probe["cpu"],
        "jax": probe["jax"],
        "date": time.strftime("%Y-%m-%d"),
        "rounds": args.rounds,
        "peak_flops": rows[0]["peak_flops"],
        "peak_source": rows[0]["peak_source"],
        "training": rows,
        "loops": loops(CPU_CASES, args.rounds, say) if with_torch else [],
        "compile": compile_times(say),
        "decode": decode(say),
        "suite_sec": time.time() - started,
    }
    print_table(result)
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {args.out}")


def _probe() -> dict:
    code = (
        "import jax, json; d = jax.devices()[0]; "
        "from jaxgpt.hardware.peak_flops import describe_cpu; "
        "print(json.dumps({'platform': d.platform, 'device_kind': d.device_kind, "
        "'device_count': jax.device_count(), 'jax': jax.__version__, 'cpu': describe_cpu()}))"
    )
    return run_json([sys.executable, "-c", code], clean_env())


if __name__ == "__main__":
    main()
