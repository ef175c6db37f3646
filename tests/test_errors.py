from __future__ import annotations

import pytest

from tokenwire import errors


@pytest.mark.parametrize("cls", [c for c in vars(errors).values() if isinstance(c, type)
                                 and issubclass(c, errors.TokenwireError)
                                 and not issubclass(c, errors.ClientError | errors.SetupError)])
def test_errors_round_trip_through_the_wire(cls: type[errors.TokenwireError]) -> None:
    exc = cls("boom", param="messages[0].content")
    again = errors.error_from_body(exc.status_code, exc.to_body())
    # a class without a code of its own comes back by its status, which names that very class
    assert type(again) is cls
    assert (again.message, again.param, again.code) == ("boom", "messages[0].content", exc.code)
    assert again.status_code == exc.status_code


def test_every_code_of_api_md_exists() -> None:
    codes = {c.default_code for c in vars(errors).values()
             if isinstance(c, type) and issubclass(c, errors.TokenwireError)}
    for code in ["invalid_token_id", "tokenizer_version_required", "unknown_tokenizer_version",
                 "tokenizer_version_mismatch", "special_token_not_allowed",
                 "non_canonical_tokens", "context_length_exceeded", "content_policy_violation",
                 "model_not_found", "invalid_api_key", "request_too_large"]:
        assert code in codes


INTERNAL = {"UpstreamStatusError", "GuideError", "LoraError"}
"""Signals caught and translated inside their own module (never raised out of it)."""


def test_one_tree_of_errors() -> None:
    """Every exception class tokenwire defines is in the tree of errors.py, drawn in its
    docstring, and exported from there (private and internal signals aside)."""
    import importlib
    import pkgutil

    import tokenwire

    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(tokenwire.__path__, "tokenwire."):
        if info.name.endswith("__main__"):
            continue
        for v in vars(importlib.import_module(info.name)).values():
            if isinstance(v, type) and issubclass(v, BaseException) \
                    and v.__module__.startswith("tokenwire") and not v.__name__.startswith("_"):
                found[v.__name__] = v
    assert {"TokenizerParityError", "UnsupportedTokenizerError", "GGUFFormatError"} <= set(found)
    tree = errors.__doc__ or ""
    for name, cls in found.items():
        if name in INTERNAL:
            continue
        assert issubclass(cls, errors.TokenwireError), name
        assert f" {name} " in tree or f" {name}\n" in tree, f"{name} is not drawn in the tree"
