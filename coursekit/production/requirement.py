"""PyTorch is optional: the ``torch`` extra (``make lab`` installs it).

A chapter that needs it starts with ``skip_rest_without_torch()``: with PyTorch it does
nothing; without it, it prints one line naming the extra and turns every later cell of the
notebook into a no-op (an IPython input transformer), so Run All ends cleanly instead of
raising the same ImportError in every cell. Library code calls :func:`import_torch`, whose
error names the extra.
"""

from __future__ import annotations

import importlib

EXTRA = "torch"
INSTALL_HINT = (f"PyTorch is not installed: this chapter needs coursekit's '{EXTRA}' extra "
                f"(make lab installs it; or: pip install -e '.[{EXTRA}]')")


def torch_available() -> bool:
    """True when ``import torch`` works (and torch.distributed is built in)."""
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return False
    return bool(torch.distributed.is_available())


def import_torch():
    """``torch``, or ModuleNotFoundError naming the extra that installs it."""
    if not torch_available():
        raise ModuleNotFoundError(INSTALL_HINT, name="torch")
    return importlib.import_module("torch")


def _skip_cell(lines: list[str]) -> list[str]:
    return ["pass\n"]


def skip_rest_without_torch() -> bool:
    """In a notebook: True with PyTorch; without it print :data:`INSTALL_HINT` once and make
    every later cell a no-op (until the kernel restarts). Returns whether torch is there."""
    if torch_available():
        return True
    print(INSTALL_HINT + ". The cells below are skipped.")
    from IPython import get_ipython
    shell = get_ipython()
    if shell is not None and _skip_cell not in shell.input_transformers_post:
        shell.input_transformers_post.append(_skip_cell)
    return False
