"""Imports every pass module in this package so their ``@register_pass`` decorators run."""
import importlib
import pkgutil

from . import __path__ as _path

_SKIP = {"manager", "rewrite", "_builtin"}
for _m in pkgutil.iter_modules(_path):
    if _m.name not in _SKIP:
        importlib.import_module(f"{__package__}.{_m.name}")
