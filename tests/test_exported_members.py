from __future__ import annotations

import importlib
import types

import pytest


@pytest.mark.parametrize("name", ["tokenwire", "tokenwire.protocol", "tokenwire.tokenizers",
                                  "tokenwire.engines", "tokenwire.errors",
                                  "tokenwire.client", "tokenwire.storage"])
def test_all_is_the_public_surface(name: str) -> None:
    """Every public class or function a module offers is in __all__, and all of it exists."""
    module = importlib.import_module(name)
    public = {k for k, v in vars(module).items()
              if not k.startswith("_") and not isinstance(v, types.ModuleType)
              and getattr(v, "__module__", "tokenwire").startswith("tokenwire")}
    exported = set(module.__all__)
    assert public <= exported, public - exported
    assert all(hasattr(module, n) for n in exported)
