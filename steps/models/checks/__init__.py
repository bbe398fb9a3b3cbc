"""Parity checks: each hand-written piece against an independent reference, with a tolerance.

A check function takes the components section (steps.components.ComponentsConfig) and returns rows
    {"component", "reference", "max_abs_err", "tolerance", "pass"}.
`parity_rows()` runs every registered check. Other modules (e.g. fused kernels in steps/perf/)
add theirs with `@register_parity`; the components stage imports the modules named in its
`extra_modules` config so their rows land in the same table.

harness.py: the registry and row helpers; components.py and blocks.py: the checks (importing this
package registers them, in that order).
"""

# importing registers their @register_parity rows, in this order (the components table's order)
from steps.models.checks import components  # noqa: F401

# isort: split
from steps.models.checks import blocks  # noqa: F401

# isort: split
from steps.models.checks.harness import PARITY_CHECKS, function_rows, parity_rows, register_parity, row

__all__ = ["PARITY_CHECKS", "function_rows", "parity_rows", "register_parity", "row"]
