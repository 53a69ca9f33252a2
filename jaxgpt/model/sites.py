"""Named activation sites: the points of the forward pass the lab may read and change.

Each is one call, `x = site(module, "hook_z", x)`, at a point TransformerLens names (its names
are the field's vocabulary; jaxgpt.lab.activations holds the table and the full names, such as
"blocks.1.attn.hook_z"). A site does two things, each only when the caller asks for it:

  read     with the "sites" collection mutable, the value is sown there (Flax's `sow`): one
           forward pass caches every site, and under jit whatever the caller does not return
           is dead code, so a cache of three names computes no more than they need;
  change   with an entry of the same name in the "interventions" collection, a dict of
           `mask`, `value` and `add` (each broadcastable to the site's shape), the value
           becomes

               (1 - mask) * x + mask * value + add

           mask 1 replaces x by value (patching, zero- and mean-ablation), 0 keeps it (both
           exactly, -inf scores included), between them blends; add steers. An
           intervention is data, not a Python hook, so one compiled program runs a whole
           sweep of them (vmap or lax.map over a leading axis of the arrays), and it goes
           through nn.scan (a leading layer axis, as the parameters have) and remat.

Training and sampling pass neither collection, and their program is then exactly the one
without these calls. Sites are in the forward pass's own order; the readable attention kernel
is used wherever a site of its scores or pattern is read or changed (the fused kernels never
form them).
"""

from __future__ import annotations

import jax.numpy as jnp

CACHE = "sites"
INTERVENTIONS = "interventions"


def site(module, name: str, x: jnp.ndarray, view: tuple[int, ...] | None = None) -> jnp.ndarray:
    """`x` as it leaves the site `name` of `module`: changed by an intervention of that name,
    sown when caching. `view`: the shape the site shows (the query heads as one axis, where
    the layer keeps them grouped as (kv heads, group)); x is reshaped to it and back."""
    intervene = changes_site(module, name)
    record = module.is_mutable_collection(CACHE)
    if not (intervene or record):
        return x
    shape = x.shape
    if view is not None:
        x = x.reshape(view)
    if intervene:
        edit = module.get_variable(INTERVENTIONS, name)
        mask, value, add = (jnp.asarray(edit[key], x.dtype) for key in ("mask", "value", "add"))
        # where at the ends, so 0 and 1 are exact for a masked score's -inf too (0 * -inf is NaN)
        x = jnp.where(mask == 0, x, jnp.where(mask == 1, value, (1 - mask) * x + mask * value)) + add
    if record:
        module.sow(CACHE, name, x)
    return x.reshape(shape)


def reads_site(module, *names: str) -> bool:
    """Whether any of `names` is read or changed in this call: the attention layer then forms
    its scores and pattern explicitly."""
    return module.is_mutable_collection(CACHE) or any(changes_site(module, n) for n in names)


def changes_site(module, name: str) -> bool:
    """Whether the site `name` is changed (not only read) in this call."""
    return module.has_variable(INTERVENTIONS, name)
