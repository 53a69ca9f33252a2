"""What the hardware is: the CPU's name and caches, and a peak that does not swing with the
load of the moment."""

from jaxgpt import hardware


def test_the_cpu_peak_is_the_best_seen_so_a_busy_start_cannot_lower_it(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXGPT_CACHE", str(tmp_path))
    measured = iter([100e9, 40e9, 130e9])  # an idle start, a busy one, a quieter one
    monkeypatch.setattr(hardware, "matmul_flops", lambda: next(measured))
    peaks = []
    for _ in range(3):
        hardware.measured_cpu_peak_flops.cache_clear()
        peaks.append(hardware.measured_cpu_peak_flops())
    assert peaks == [100e9, 100e9, 130e9]
    assert (tmp_path / "cpu_peak.json").is_file()


def test_the_machine_is_described_by_name_cores_and_cache(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_model", lambda: "Example CPU 9000")
    monkeypatch.setattr(hardware, "cpu_cache_bytes", lambda level: 32 * 2**20 if level == 3 else None)
    monkeypatch.setattr(hardware.os, "cpu_count", lambda: 2)
    assert hardware.describe_cpu() == "Example CPU 9000 (2 cores, L3 32 MiB)"


def test_cache_sizes_are_read_as_the_kernel_writes_them(monkeypatch, tmp_path):
    for index, (level, kind, size) in enumerate([(1, "Data", "32K"), (1, "Instruction", "32K"), (3, "Unified", "32M")]):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        (folder / "level").write_text(f"{level}\n")
        (folder / "type").write_text(f"{kind}\n")
        (folder / "size").write_text(f"{size}\n")
    monkeypatch.setattr(hardware, "CPU_CACHE_DIR", tmp_path)
    assert hardware.cpu_cache_bytes(1) == 32 * 2**10
    assert hardware.cpu_cache_bytes(3) == 32 * 2**20
    assert hardware.cpu_cache_bytes(2) is None
