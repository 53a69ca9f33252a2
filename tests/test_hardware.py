"""What the hardware is: the CPU's name and caches, and a peak that does not swing with the
load of the moment."""

import math
from types import SimpleNamespace

import pytest

from jaxgpt.hardware import peak_flops
from jaxgpt.job.metrics import model_flops_utilisation

ZEN3 = {"vendor_id": "AuthenticAMD", "cpu family": "25", "flags": "sse2 avx fma avx2", "cpu MHz": "2445.4"}


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A CPU described by hand: cpuinfo fields, a cache folder, and matmul measurements that
    say whether the rest of the machine was idle."""
    monkeypatch.setenv("JAXGPT_CACHE", str(tmp_path))
    monkeypatch.setattr(peak_flops, "cpuinfo", lambda: dict(ZEN3))
    monkeypatch.setattr(peak_flops, "physical_cores", lambda: 2)
    monkeypatch.setattr(peak_flops, "cpu_clock_hz", lambda: (2.5e9, "clock in /proc/cpuinfo"))
    measurements = []  # (FLOP/s, idle) per start

    def measure_when_idle(measure):
        start.measured += 1
        return measurements[-1]

    monkeypatch.setattr(peak_flops, "measure_when_idle", measure_when_idle)

    def start(flops: float, idle: bool) -> tuple[float, str]:
        """A start of a command whose matmul, if it measures one, gives `flops`."""
        measurements.append((flops, idle))
        peak_flops.cpu_peak_flops.cache_clear()
        return peak_flops.cpu_peak_flops()

    start.measured = 0  # how many starts measured
    yield start
    peak_flops.cpu_peak_flops.cache_clear()


def test_the_cpu_peak_is_computed_from_cores_clock_and_flops_per_cycle(machine):
    """2 cores x 2.5 GHz x (8 float32 lanes x 2 FLOPs per FMA x 2 FMA units) = 160 GFLOP/s,
    whatever a busy start measures."""
    for measured in (40e9, 150e9, 10e9):
        peak, source = machine(measured, idle=False)
        assert peak == 2 * 2.5e9 * 32
        assert "2 cores x 2.50 GHz" in source and "32 float32 FLOP/cycle" in source


def test_the_peak_is_the_same_at_every_start_and_an_idle_measurement_is_only_its_check(machine):
    """The first start on a machine (no measurement yet) and every later one divide by the same
    160 GFLOP/s, busy or idle; an idle matmul beating it (a VM hiding its boost clock) is named
    beside it. Busy starts measure again; once an idle measurement is on record, starts show it
    and measure no more."""
    first, source = machine(222e9, idle=False)
    assert first == 160e9 and "no idle matmul measurement yet" in source
    peak, source = machine(222e9, idle=True)
    assert peak == 160e9 and "idle matmul measured 222" in source and "faster than this clock" in source
    assert machine.measured == 2
    assert machine(100e9, idle=False) == (160e9, source)
    peak, source = machine(300e9, idle=True)
    assert peak == 160e9 and "idle matmul measured 222" in source and machine.measured == 2


@pytest.mark.parametrize(
    "flags, per_cycle, named",
    [
        ("", 32, "no bfloat16 units"),  # products converted and computed at float32's rate
        (" avx512f avx512_bf16", 64, "AVX512-BF16"),  # Zen 4: a 512-bit dot product of 32 pairs a cycle
        (" avx512f avx512_bf16 amx_bf16 amx_tile", 1024, "AMX-BF16"),  # 16 x 32 x 16 products, 16 cycles
    ],
)
def test_a_bfloat16_run_on_a_cpu_is_measured_against_its_bfloat16_units(machine, monkeypatch, flags, per_cycle, named):
    """2 cores x 2.5 GHz x the units' bfloat16 FLOPs per cycle; float32's figure is unchanged,
    and the idle float32 matmul is still the check of the clock (222 > float32's 160)."""
    monkeypatch.setattr(peak_flops, "cpuinfo", lambda: ZEN3 | {"flags": ZEN3["flags"] + flags})
    machine(222e9, idle=True)
    peak, source = peak_flops.cpu_peak_flops("bfloat16")
    assert peak == 2 * 2.5e9 * per_cycle and f"{per_cycle} bfloat16 FLOP/cycle" in source and named in source
    assert "idle float32 matmul measured 222" in source and "faster than this clock" in source
    assert peak_flops.cpu_peak_flops("float32")[0] == 160e9


def test_without_a_computed_peak_the_best_idle_measurement_is_the_peak_and_measured_at_every_start(
    machine, monkeypatch
):
    monkeypatch.setattr(peak_flops, "cpu_clock_hz", lambda: None)
    assert machine(100e9, idle=True)[0] == 100e9
    assert machine(300e9, idle=False)[0] == 100e9  # a busy measurement never counts
    assert machine(150e9, idle=True)[0] == 150e9 and machine.measured == 3


@pytest.mark.parametrize(
    "info, per_cycle",
    [
        (ZEN3, 32),  # Zen 3: two 256-bit FMA pipes
        (ZEN3 | {"cpu family": "25", "flags": ZEN3["flags"] + " avx512f"}, 32),  # Zen 4: 512-bit on 256-bit pipes
        (ZEN3 | {"cpu family": "26", "flags": ZEN3["flags"] + " avx512f"}, 64),  # Zen 5: full 512-bit pipes
        ({"vendor_id": "GenuineIntel", "cpu family": "6", "flags": "avx fma avx2 avx512f"}, 64),
        ({"vendor_id": "GenuineIntel", "cpu family": "6", "flags": "sse2 avx"}, 16),  # Sandy Bridge: no FMA
        ({"vendor_id": "ARM", "flags": "asimd"}, None),
    ],
)
def test_flops_per_cycle_follow_the_vector_width_and_fma_units(info, per_cycle):
    found = peak_flops.float32_flops_per_cycle(info)
    assert (found and found[0]) == per_cycle


def test_hyperthreads_of_one_core_count_once(monkeypatch, tmp_path):
    """Two logical CPUs on core 0 and one on core 1: two physical cores share the FMA units."""
    for cpu, core in enumerate([0, 0, 1]):
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text("0\n")
        (topology / "core_id").write_text(f"{core}\n")
    monkeypatch.setattr(peak_flops, "SYS_CPU", tmp_path)
    monkeypatch.setattr(peak_flops.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert peak_flops.physical_cores() == 2


def test_a_measurement_is_idle_only_if_other_processes_used_almost_no_cpu(monkeypatch):
    """Our own CPU time is subtracted from the machine's; what is left belongs to others."""
    busy = iter([100.0, 100.0 + 0.9])  # the machine's busy CPU-seconds before and after
    monkeypatch.setattr(peak_flops, "_machine_busy_seconds", lambda: next(busy))
    monkeypatch.setattr(peak_flops.os, "cpu_count", lambda: 2)
    times = iter([1.0, 1.9])  # our own user time: 0.9 s, i.e. all the machine's busy time
    monkeypatch.setattr(peak_flops.os, "times", lambda: SimpleNamespace(user=next(times), system=0.0))
    assert peak_flops.measure_when_idle(lambda: 7) == (7, True)
    busy = iter([100.0, 100.0 + 1.9])  # someone else used a whole second meanwhile
    times = iter([1.0, 1.9])
    assert peak_flops.measure_when_idle(lambda: 7) == (7, False)


def test_an_mfu_above_one_is_not_printed_as_a_number():
    assert model_flops_utilisation(50e9, 100e9) == 0.5
    assert math.isnan(model_flops_utilisation(120e9, 100e9))


def test_the_machine_is_described_by_name_cores_and_cache(monkeypatch):
    monkeypatch.setattr(peak_flops, "cpu_model", lambda: "Example CPU 9000")
    monkeypatch.setattr(peak_flops, "cpu_cache_bytes", lambda level: 32 * 2**20 if level == 3 else None)
    monkeypatch.setattr(peak_flops.os, "cpu_count", lambda: 2)
    assert peak_flops.describe_cpu() == "Example CPU 9000 (2 cores, L3 32 MiB)"


def test_cache_sizes_are_read_as_the_kernel_writes_them(monkeypatch, tmp_path):
    for index, (level, kind, size) in enumerate([(1, "Data", "32K"), (1, "Instruction", "32K"), (3, "Unified", "32M")]):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        (folder / "level").write_text(f"{level}\n")
        (folder / "type").write_text(f"{kind}\n")
        (folder / "size").write_text(f"{size}\n")
    monkeypatch.setattr(peak_flops, "CPU_CACHE_DIR", tmp_path)
    assert peak_flops.cpu_cache_bytes(1) == 32 * 2**10
    assert peak_flops.cpu_cache_bytes(3) == 32 * 2**20
    assert peak_flops.cpu_cache_bytes(2) is None


def test_what_is_derived_is_kept_whole_or_not_at_all(tmp_path):
    """machine.keep writes beside its file and renames: the file holds the new text and nothing
    is left beside it; where the directory cannot be made (a file stands in its place), nothing
    is written and nothing is raised."""
    from jaxgpt.hardware import machine

    kept = tmp_path / "derived" / "figure.json"
    machine.keep(kept, "old")
    machine.keep(kept, "new")
    assert kept.read_text() == "new" and [p.name for p in kept.parent.iterdir()] == ["figure.json"]
    (tmp_path / "a_file").write_text("")
    machine.keep(tmp_path / "a_file" / "figure.json", "lost")  # its parent is a file: not kept
    assert (tmp_path / "a_file").read_text() == ""
