"""The memory check run before training: its footprint never exceeds what the compiled step
holds (so it never refuses a run that fits), and its refusals name the exact boundary."""

import re

import jax
import pytest
from conftest import small_run_config, users_environment

from jaxgpt import sharding
from jaxgpt.commands.dispatch import COMMANDS
from jaxgpt.config import MeshConfig
from jaxgpt.config_files import resolve
from jaxgpt.errors import UserError
from jaxgpt.hardware import memory
from jaxgpt.hardware.mesh_step import jit_train_step, state_layout
from jaxgpt.training.batch import batch_layout
from jaxgpt.training.program import training_program

GiB = 2**30
ONE_DEVICE = MeshConfig(data=1, fsdp=1, tensor=1)


def one_device():
    return sharding.make_mesh(ONE_DEVICE, jax.devices()[:1])


def run_for(model=(), **train):
    config = small_run_config(**({"microbatches": 1} | train))
    config.model.update(dict(model))
    return resolve(config, vocab_size=96)


def state_of(run, mesh) -> tuple[int, int]:
    return memory.state_bytes(state_layout(training_program(run), mesh)[0])


def footprint(run, mesh) -> memory.Footprint:
    return memory.footprint(run, mesh, state_of(run, mesh))


def compiled_bytes(run, mesh) -> int:
    """What XLA's buffer assignment gives the step: its arguments (state and batch; the state
    is donated, so the outputs reuse it) and its temporaries."""
    program = training_program(run)
    layout, _ = state_layout(program, mesh)
    analysis = (
        jit_train_step(program, mesh, layout).lower(layout, batch_layout(program.run, mesh)).compile().memory_analysis()
    )
    return analysis.argument_size_in_bytes + analysis.temp_size_in_bytes


# Each compiles a training step (~10 s on 2 cores): the quick set keeps the case where the
# bound is tightest to matter (logits and scores dominate); the slow set has the rest.
@pytest.mark.parametrize(
    "model, train",
    [
        pytest.param({"block_size": 256, "vocab_size": 4096}, {"batch_size": 4}, id="long-wide-vocab"),
        pytest.param({}, {}, id="small", marks=pytest.mark.slow),
        pytest.param(
            {"n_layer": 4, "remat": "full"}, {"batch_size": 16, "microbatches": 4}, id="remat-microbatched",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            {"activation": "swiglu", "n_kv_head": 1, "position": "rope"}, {"dtype": "bfloat16"}, id="swiglu-mqa-bf16",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            {"attention": "dot_product", "scan_layers": True}, {"optimizer": "muon"}, id="scanned-muon",
            marks=pytest.mark.slow,
        ),
    ],
)  # fmt: skip
def test_the_footprint_is_a_lower_bound_on_the_compiled_step(model, train):
    run = run_for(model, **train)
    mesh = one_device()
    estimate = footprint(run, mesh)
    compiled = compiled_bytes(run, mesh)
    assert estimate.device <= compiled, (estimate, compiled)
    # and not an empty bound: XLA's CPU buffers hold several copies of what a layer needs, of
    # which the bound counts one (measured 0.25-0.48 of the compiled figure for these five)
    assert estimate.device >= 0.2 * compiled, (estimate, compiled)


def test_parameters_and_optimizer_state_are_counted_exactly():
    """2 layers x 32 wide, 96 tokens, 32 learned positions, tied embeddings: each block has
    two LayerNorms (2 x 64), qkv 32 x 96 + 96, out 32 x 32 + 32, MLP 32 x 128 + 128 and
    128 x 32 + 32; then the final norm 64 and the embeddings 96 x 32 + 32 x 32. AdamW keeps
    two moments per parameter."""
    block = 2 * 64 + (32 * 96 + 96) + (32 * 32 + 32) + (32 * 128 + 128) + (128 * 32 + 32)
    params = 2 * block + 64 + 96 * 32 + 32 * 32
    run = run_for()
    mesh = one_device()
    with_optimizer, alone = state_of(run, mesh)
    assert alone == 4 * params
    assert with_optimizer - alone >= 2 * 4 * params  # plus the optimizer's few scalar counters
    assert with_optimizer - alone < 2 * 4 * params + 64


def test_sharding_divides_the_state_among_the_devices():
    run = run_for(batch_size=8)
    whole, _ = state_of(run, one_device())
    split, _ = state_of(run, sharding.make_mesh(MeshConfig(data=1, fsdp=4, tensor=1), jax.devices()[:4]))
    assert split < whole / 2  # every matrix splits four ways; vectors and scalars stay whole


@pytest.mark.parametrize("fsdp", [1, 4])
def test_the_position_table_is_all_of_the_state_that_grows_with_the_block(fsdp):
    """check_fits sizes smaller blocks from one layout: the learned table (block_size x d_model,
    and its two moments) scales row for row, exact to the byte against the other block's own
    layout, split over fsdp or not; with RoPE nothing grows."""
    mesh = sharding.make_mesh(MeshConfig(data=1, fsdp=fsdp, tensor=1), jax.devices()[:fsdp])
    state, table = (
        state_of(run_for(), mesh),
        memory.position_table_bytes(state_layout(training_program(run_for()), mesh)[0]),
    )
    assert table == (3 * 4 * 32 * 32 // fsdp, 4 * 32 * 32 // fsdp)  # float32 params, mu and nu
    scaled = tuple(whole - part + part * 200 // 32 for whole, part in zip(state, table, strict=True))
    assert scaled == state_of(run_for(model={"block_size": 200}), mesh)
    rope = run_for(model={"position": "rope"})
    assert memory.position_table_bytes(state_layout(training_program(rope), mesh)[0]) == (0, 0)


def refusal(monkeypatch, run, host_bytes) -> str:
    monkeypatch.setattr(memory, "host_memory_bytes", lambda: host_bytes)
    with pytest.raises(UserError) as refused:
        memory.check_fits(run, one_device(), state_layout(training_program(run), one_device())[0])
    return str(refused.value)


def test_the_largest_batch_named_is_the_boundary(monkeypatch):
    """A machine with exactly the memory 40 rows need: 64 rows are refused, naming 40."""
    mesh = one_device()
    need_40 = footprint(run_for(batch_size=40), mesh)
    message = refusal(monkeypatch, run_for(batch_size=64), need_40.device + need_40.host)
    assert re.search(r"train.batch_size=64 with model.block_size=32 needs at least [\d.]+ GiB of host memory", message)
    assert message.endswith("the largest batch_size that fits is 40")


def test_the_largest_block_is_named_when_one_row_does_not_fit(monkeypatch):
    mesh = one_device()
    need = footprint(run_for(model={"block_size": 200}, batch_size=1), mesh)
    message = refusal(monkeypatch, run_for(model={"block_size": 512}), need.device + need.host)
    assert message.endswith("even batch_size=1 does not fit, and the largest block_size that fits at that batch is 200")


def test_a_model_too_large_for_any_batch_says_so(monkeypatch):
    mesh = one_device()
    rope = run_for(model={"position": "rope"})  # no parameter shrinks with the block
    state, params = state_of(rope, mesh)
    message = refusal(monkeypatch, rope, state + params)  # not a byte left for a batch
    assert "does not fit even as one token per row: the model's parameters, gradients and optimizer state" in message


def test_an_address_space_limit_is_memory_the_run_cannot_use(monkeypatch):
    """`ulimit -v` bounds what the process maps, and JAX and XLA map RUNTIME_ADDRESS_SPACE of
    it for themselves: a limit below that is refused whatever the run, and one above it leaves
    the rest for the run, the message naming the limit."""
    monkeypatch.setattr(memory, "host_memory_bytes", lambda: 24 * GiB)
    monkeypatch.setattr(memory, "address_space_limit", lambda: GiB)
    with pytest.raises(UserError) as refused:
        memory.check_fits(run_for(), one_device(), state_layout(training_program(run_for()), one_device())[0])
    assert str(refused.value) == (
        "this process may map at most 1.0 GiB (ulimit -v), and JAX and XLA alone map about 2.5 GiB; raise the "
        "limit (ulimit -v unlimited) and rerun"
    )
    limit = memory.RUNTIME_ADDRESS_SPACE + GiB // 4
    monkeypatch.setattr(memory, "address_space_limit", lambda: limit)
    monkeypatch.setattr(memory, "host_memory_bytes", lambda: GiB // 4)  # what the limit leaves
    message = refusal(monkeypatch, run_for(batch_size=10**6), GiB // 4)
    assert "more than its 0.2 GiB (the 2.8 GiB `ulimit -v` allows this process, less about 2.5 GiB" in message


def test_the_limit_set_by_ulimit_is_read_from_the_process(tmp_path):
    """`ulimit -v 1500000` (1.4 GiB) in the shell that starts training: one line and exit 2
    before any work (it used to abort in XLA: std::bad_alloc), nothing written."""
    import shlex
    import subprocess
    import sys

    from conftest import ROOT

    command = [sys.executable, str(ROOT / "train.py"), "--config=tiny", f"--workdir={tmp_path / 'run'}", "--quiet"]
    env = users_environment()  # the user's default device count, not the test session's eight
    result = subprocess.run(
        ["bash", "-c", f"ulimit -v 1500000 && exec {shlex.join(command)}"], capture_output=True, text=True, env=env
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith("error: this process may map at most 1.4 GiB (ulimit -v)")
    assert not (tmp_path / "run").exists()


# train's is above; plot, timeline and prepare start no JAX backend, and run under the limit
@pytest.mark.parametrize(
    "command", [name for name in COMMANDS if name not in ("train", "plot", "timeline", "prepare", "seq2seq")]
)
def test_every_command_refuses_a_limit_jax_cannot_run_under_in_one_line(command, tmp_path):
    """The same start-up guard for every command (jaxgpt.commands.cli.run): under `ulimit -v
    1000000` (0.95 GiB) sample and fill used to die starting a thread, evaluate in
    std::bad_alloc (exit 134), the retired seq2seq with 127 (it now starts nothing: its one line
    names train.py). Now each says why in one line and exits 2, before it reads its flags or
    its workdir."""
    import os
    import shlex
    import subprocess
    import sys

    from conftest import ROOT

    invocation = shlex.join([sys.executable, "-m", "jaxgpt", command, f"--workdir={tmp_path / 'run'}"])
    result = subprocess.run(
        ["bash", "-c", f"ulimit -v 1000000 && exec {invocation}"], capture_output=True, text=True, cwd=ROOT,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith("error: this process may map at most 1.0 GiB (ulimit -v)")


def test_a_run_that_fits_passes(monkeypatch):
    monkeypatch.setattr(memory, "host_memory_bytes", lambda: 24 * GiB)
    memory.check_fits(run_for(), one_device(), state_layout(training_program(run_for()), one_device())[0])
