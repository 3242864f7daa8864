"""`make wheelhouse`'s pieces that need no network: the target's package list, the constraints given to pip (the
target's own versions win over ours), and the platform tags a manylinux_2_28 machine runs. The whole command was
run by hand into a bare venv (docs/offline-gpu-install.md; the issue's note has the figures)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "tools"))

import wheelhouse  # noqa: E402


def test_the_targets_packages_replace_our_pins_and_are_never_downloaded(tmp_path):
    have = tmp_path / "base.txt"
    have.write_text("Torch==2.11.0\nnvidia_cudnn_cu12==9.1.0.70\n# a comment\nsome-editable @ file:///x\n")
    found = wheelhouse.read_have(have)
    assert found == {"torch": "2.11.0", "nvidia-cudnn-cu12": "9.1.0.70"}
    constraints = wheelhouse.target_constraints(found, tmp_path).read_text().splitlines()
    assert "torch==2.11.0" in constraints and not any(line.startswith("torch==2.13") for line in constraints)
    assert any(line.startswith("prefect") for line in constraints)  # our other pins stay


def test_a_manylinux_2_28_target_also_takes_older_manylinux_wheels():
    tags = wheelhouse.platform_tags("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert wheelhouse.platform_tags("macosx_14_0_arm64") == ["macosx_14_0_arm64"]


def test_a_missing_package_list_is_a_clear_error(tmp_path, capsys):
    assert wheelhouse.main(["--out", str(tmp_path / "wh"), "--have", str(tmp_path / "nope.txt")]) == 2
    assert "--have" in capsys.readouterr().err
