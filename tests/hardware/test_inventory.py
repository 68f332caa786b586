"""Reading a captured node bundle (--replay): files of the wrong shape are named, never a traceback."""

from __future__ import annotations

from typing import Any

import pytest

from gpucert.cli import main


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("software.json", '{"foo": 1}', None),  # a newer capture's extra name: left unread
        ("software.json", "[1]", "software.json: expected a JSON object, found a list"),
        ("environment.json", "not json", "environment.json: not readable as JSON: Expecting value"),
        ("nvml-snapshot.json", "[]", "cannot read NVML snapshot: expected a JSON object (a gpucert NVML snapshot)"),
    ],
)
def test_a_bundle_file_of_the_wrong_shape_is_named_not_a_traceback(
    bundle_copy: Any, name: str, text: str, said: str | None, capsys: Any
) -> None:
    """An extra key in software.json was a TypeError traceback; a list as nvml-snapshot.json an AttributeError."""
    bundle = bundle_copy("h100")
    (bundle / name).write_text(text)
    code = main(["discover", "--replay", str(bundle), "-o", str(bundle.parent / "run")])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if said is None:
        assert code == 0, err
    else:
        assert code == 3 and said in err and str(bundle / name) in err, err
