"""Taking a model's standard ops down to an older default-domain opset (``--target-opset``).

In: a ``ModelProto`` (changed in place: the engine hands its own copy) and a target opset
N (11 up to the newest). Out: the same model at opset N: every default-domain node whose
schema at N differs from its schema at the model's opset is rewritten to N's signature
with the same meaning, in every graph (If/Loop/Scan bodies included) and in every
model-local function that imports the default domain; the IR version follows N. What it
cannot rewrite is returned as :class:`Refusal`s (the engine turns them into exit 3).

Nodes of an op N does not define (LayerNormalization below 17, Gelu below 20, ...) are
left as they are: at N they are no longer standard, so the engine's lowering patterns
rewrite them like any other non-standard node.

How one node goes down: for each version of its op newer than the one N has, newest
first, the step's adapter (:data:`ADAPTERS`, written from onnx/docs/Changelog.md) brings
it to the previous version's signature. Every step then drops what the older schema lacks
if it holds its default (an attribute, or an absent trailing input), and refuses anything
else. Last, an input or output whose element type N's schema does not allow is carried in
a wider type that holds every value exactly (``float16``/``bfloat16`` in ``float``, small
integers in ``int32``, ...), with a ``Cast`` on each side. ``docs/opset-adapters.md``
(generated from :func:`adapter_table`) lists every op and version pair.

A target at or above the model's opset changes nothing here: decomposer never upgrades.
Needs no torch.
"""

from decomposer.opsets.adapters import ADAPTERS, adapter_table
from decomposer.opsets.core import (
    LOWERING_DOMAIN,
    NEWEST_OPSET,
    Refusal,
    default_opset,
    ir_version_for,
    take_down,
)

__all__ = ["ADAPTERS", "LOWERING_DOMAIN", "NEWEST_OPSET", "Refusal", "adapter_table",
           "default_opset", "ir_version_for", "take_down"]
