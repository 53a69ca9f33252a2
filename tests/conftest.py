"""Shared test setup: eight fake CPU devices, float32, fixed seeds.

XLA reads XLA_FLAGS once, when jax is first imported, so this must run before any test
module imports jax; pytest imports conftest.py first.
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
