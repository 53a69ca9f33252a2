"""Where train.py's step spends its time: the compiled step run under JAX's profiler, every
operation XLA executed summed by kind (matmuls, layout copies, the rest), with the largest ones.

    python bench/step_profile.py --config configs/tiny.py --config.model.block_size=64 [--steps 10]

It takes bench/train_throughput.py's flags (--config and overrides, --vocab, --steps) and builds
the step as it does.

Each event the profiler records on XLA's threads (on a CPU) or on the GPU's streams (each kernel
tagged with the HLO operation that launched it) is one operation of a compiled program, named
as in the program's HLO; its kind is read from that HLO (a dot, or a fusion around one, or
cuBLAS's custom call, is a matmul; cuDNN's fused attention is attention; copies and transposes
alone move data between layouts; everything else computes elementwise values or reductions).
The profiler slows the step (its own bookkeeping per event), so the table gives each kind's
share of the recorded time, not a speed: speeds come from bench/train_throughput.py. Writes
JSON (--out), and with --hlo the compiled programs' text, gzipped, to read beside it.
"""

from __future__ import annotations

import collections
import gzip
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from absl import flags  # noqa: E402
from train_throughput import CONFIG, STEPS, VOCAB, prepare  # noqa: E402  (its flags are this script's)

from jaxgpt.commands import cli  # noqa: E402
from jaxgpt.hardware import runtime  # noqa: E402

TOP = flags.DEFINE_integer("top", 15, "largest single operations listed")
OUT = flags.DEFINE_string("out", "bench/results/step_profile.json", "where the JSON goes")
HLO = flags.DEFINE_string("hlo", "", "also write the compiled programs' HLO text here (gzipped)")

MOVES_DATA = {"copy", "transpose", "bitcast", "broadcast", "reshape", "parameter", "slice", "concatenate", "tuple"}
COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) .*\{$")
# the shape may be a tuple, "(bf16[8,64]{1,0}, s8[1024]{0})", as a GPU custom call's is
INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%([\w.\-]+) = (.+?) ([\w\-]+)\(")
CALLS = re.compile(r"calls=%([\w.\-]+)")
TARGET = re.compile(r'custom_call_target="([^"]+)"')


def instruction_kinds(hlo_text: str) -> dict[str, tuple[str, str]]:
    """{instruction name: (kind, shape)} for a compiled program's HLO text."""
    opcodes: dict[str, set] = collections.defaultdict(set)  # computation -> the opcodes in it
    instructions = []  # (name, shape, opcode, the computation it calls)
    computation = None
    for line in hlo_text.splitlines():
        if header := COMPUTATION.match(line):
            computation = header.group(1)
        elif instruction := INSTRUCTION.match(line):
            name, shape, opcode = instruction.groups()
            if opcode == "custom-call" and (target := TARGET.search(line)):
                opcode = custom_call_kind(target.group(1))
            opcodes[computation].add(opcode)
            called = CALLS.search(line)
            instructions.append((name, shape, opcode, called.group(1) if called else None))
    kinds = {}
    for name, shape, opcode, called in instructions:
        inner = opcodes[called] if opcode == "fusion" else {opcode}
        if "fused attention" in inner:
            kind = "fused attention"
        elif inner & {"dot", "convolution"}:
            kind = "matmul"
        elif inner <= MOVES_DATA:
            kind = "layout copy"
        else:
            kind = "elementwise and reductions"
        kinds[name] = (kind, shape)
    return kinds


def custom_call_kind(target: str) -> str:
    """A custom call's opcode for the kinds above, by its target's library (LIBRARY_KERNELS):
    cuBLAS's matmuls ("__cublas$lt$matmul") count as a dot, cuDNN's fused attention
    ("__cudnn$fmha...") as fused attention, any other call as a custom call."""
    return {"matmul": "dot", "fused attention": "fused attention"}.get(library_kernel_kind(target), "custom-call")


def kernel_instruction(kernel: str, kinds: dict) -> str | None:
    """The instruction an XLA-generated GPU kernel was named after ("loop_add_fusion_3" for
    "loop_add_fusion.3": XLA's kernel names replace the instruction's dots), if any."""
    if kernel in kinds:
        return kernel
    head, _, tail = kernel.rpartition("_")
    return f"{head}.{tail}" if tail.isdigit() and f"{head}.{tail}" in kinds else None


LIBRARY_KERNELS = [  # (kind, words in the names of a library's GPU kernels), seen on an H200
    ("matmul", ("nvjet", "gemm", "cublas", "cutlass")),  # cuBLAS: "nvjet_sm90_tst_128x160_..."
    # "__cudnn$fmha...", "cudnn_generated_fort_native_sdpa_...", and the helpers of its backward pass
    ("fused attention", ("fmha", "sdpa", "flash", "cudnn::fusion")),
    ("layout copy", ("memcpy", "memset")),
]


def library_kernel_kind(kernel: str) -> str:
    """The kind of a GPU kernel that no HLO instruction is tagged on (cuBLAS's, cuDNN's and
    the driver's copies are named by their library), by words in its name."""
    name = kernel.lower()
    return next((kind for kind, words in LIBRARY_KERNELS if any(w in name for w in words)), "unattributed kernels")


def recorded_operations(trace_dir: str, kinds: dict) -> tuple[collections.Counter, collections.Counter]:
    """(nanoseconds per HLO instruction name, nanoseconds per GPU kernel name). On a CPU the
    operations are the events of XLA's threads, named as the HLO's instructions; on a GPU, the
    kernels on the device's streams, each tagged with the instruction that launched it (a
    kernel without a tag is counted under its own name, prefixed "kernel: ")."""
    import jax

    [path] = Path(trace_dir).rglob("*.xplane.pb")
    profile = jax.profiler.ProfileData.from_file(str(path))
    on_gpu = any(plane.name.startswith("/device:GPU") for plane in profile.planes)
    spent, kernels = collections.Counter(), collections.Counter()
    for plane in profile.planes:
        if on_gpu and not plane.name.startswith("/device:GPU"):
            continue  # the host's events are launches, not the work
        for line in plane.lines:
            for event in line.events:
                if not on_gpu:
                    if event.name in kinds:
                        spent[event.name] += event.duration_ns
                    continue
                operation = dict(event.stats).get("hlo_op")
                operation = operation if operation in kinds else kernel_instruction(event.name, kinds)
                spent[operation or f"kernel: {event.name[:120]}"] += event.duration_ns
                kernels[event.name[:120]] += event.duration_ns
    return spent, kernels


def main() -> None:
    cli.parse_flags(sys.argv, usage=__doc__)
    cli.require_config(CONFIG)
    runtime.configure()
    import jax

    from jaxgpt.hardware.peak_flops import describe_cpu

    prepared = prepare(CONFIG.value, VOCAB.value)
    state, step, batches = prepared.state, prepared.compiled, prepared.batches
    texts = step.program_texts(state, batches[0])
    if HLO.value:
        Path(HLO.value).parent.mkdir(parents=True, exist_ok=True)
        Path(HLO.value).write_bytes(gzip.compress("\n\n".join(texts).encode()))
    kinds = {}
    for text in texts:  # the gradient program first: the update's few names that repeat its own are left to it
        kinds = instruction_kinds(text) | kinds
    for i in range(3):
        state, metrics = step(state, batches[i % len(batches)])
    jax.block_until_ready(metrics)
    with tempfile.TemporaryDirectory() as trace_dir:
        started = time.perf_counter()
        with jax.profiler.trace(trace_dir):
            for i in range(STEPS.value):
                state, metrics = step(state, batches[i % len(batches)])
            jax.block_until_ready(metrics)
            profiled_ms = 1000 * (time.perf_counter() - started) / STEPS.value  # not the trace's writing
        spent, kernels = recorded_operations(trace_dir, kinds)

    kinds = kinds | {name: (library_kernel_kind(name), "") for name in spent if name not in kinds}
    total = sum(spent.values())
    by_kind = collections.Counter()
    for name, ns in spent.items():
        by_kind[kinds[name][0]] += ns
    per_step = 1e-6 / STEPS.value
    machine = describe_cpu() if jax.default_backend() == "cpu" else jax.devices()[0].device_kind
    print(f"{machine}; {prepared.cores} core(s), {prepared.run.train.microbatches} microbatch(es)")
    print(f"profiled step {profiled_ms:.1f} ms (slowed by the profiler); operations recorded per step, all threads:")
    print(f"{'kind':<28}{'ms/step':>10}{'share':>8}")
    for kind, ns in by_kind.most_common():
        print(f"{kind:<28}{ns * per_step:>10.2f}{ns / total:>8.1%}")
    print(f"\nlargest operations ({TOP.value}):")
    top = spent.most_common(TOP.value)
    for name, ns in top:
        kind, shape = kinds[name]
        print(f"{ns * per_step:>9.2f} ms  {ns / total:>6.1%}  {kind:<28}{name:<28}{shape}")
    result = {
        "machine": machine,
        "cores": prepared.cores,
        "microbatches": prepared.run.train.microbatches,
        "steps": STEPS.value,
        "profiled_step_ms": profiled_ms,
        "ms_per_step_by_kind": {kind: ns * per_step for kind, ns in by_kind.items()},
        "share_by_kind": {kind: ns / total for kind, ns in by_kind.items()},
        "largest": [
            {"name": n, "kind": kinds[n][0], "shape": kinds[n][1], "ms_per_step": ns * per_step} for n, ns in top
        ],
        "largest_kernels": [{"name": n, "ms_per_step": ns * per_step} for n, ns in kernels.most_common(TOP.value)],
    }
    out = Path(OUT.value)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
