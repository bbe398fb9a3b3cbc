"""The two exceptions a stage raises on purpose; `steps.core.job` records each its own way."""


class SkipCell(Exception):
    """A declared cell that cannot run here (e.g. needs CUDA): recorded with its reason, not faked."""


class InputError(Exception):
    """Bad input data or paths: shown as one clear message (file, field, fix), no traceback."""
