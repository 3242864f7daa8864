"""`make wheelhouse`: every wheel unirl needs on a target machine without network, in one folder.

    python tools/wheelhouse.py --out wheelhouse [--python-version 3.12] [--platform manylinux_2_28_x86_64]
                               [--have base-packages.txt] [--extras ...]

1. pip resolves the project for the target (its Python version and platform, binary wheels only, through
   `constraints.txt`; the packages of `--have` pinned to the versions the target already has) without installing or
   downloading the wheels (`pip install --dry-run --report`; registries serve the metadata alone).
2. Each resolved package the target lacks is downloaded (`pip download --no-deps name==version`); the project itself
   is built as a wheel. What `--have` lists is skipped: give it the target image's `pip list --format=freeze`
   (a CUDA PyTorch image already has torch and its CUDA libraries, gigabytes you need not copy).
3. `<out>/requirements.txt` lists what was resolved (the target's own packages included, at their versions).

On the target: `pip install --no-index --find-links <out> -r <out>/requirements.txt` (docs/offline-gpu-install.md).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_have(path: Path | None) -> dict[str, str]:
    """{canonical name: version} of a `pip list --format=freeze` file (`name==version` lines)."""
    have = {}
    for line in path.read_text().splitlines() if path else []:
        name, sep, version = line.strip().partition("==")
        if sep and name and not name.startswith("#"):
            have[canonical(name)] = version.split()[0]
    return have


def target_constraints(have: dict[str, str], folder: Path) -> Path:
    """constraints.txt without the pins of packages the target has, plus the target's own versions."""
    kept = [line for line in (ROOT / "constraints.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")
            and canonical(re.split(r"[<>=!~ \[;]", line.strip(), maxsplit=1)[0]) not in have]  # fmt: skip
    path = folder / "constraints.txt"
    path.write_text("\n".join(kept + [f"{name}=={version}" for name, version in sorted(have.items())]) + "\n")
    return path


def platform_tags(platform: str) -> list[str]:
    """`platform` and the older manylinux tags a machine of it also runs (pip matches an explicit `--platform`
    exactly: Ray publishes manylinux2014 wheels, which a manylinux_2_28 machine runs)."""
    match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if not match:
        return [platform]
    glibc, arch = int(match[1]), match[2]
    legacy = [f"manylinux{name}_{arch}" for name in ("2014", "2010", "1")]
    return [f"manylinux_2_{minor}_{arch}" for minor in range(glibc, 4, -1)] + legacy


def target_args(args) -> list[str]:
    platforms = [arg for tag in platform_tags(args.platform) for arg in ("--platform", tag)]
    return ["--only-binary=:all:", "--python-version", args.python_version, *platforms, "--implementation", "cp"]


def resolve(args, constraints: Path, folder: Path) -> dict[str, str]:
    """{canonical name: version} of every package the project needs on the target."""
    report = folder / "report.json"
    project = f"{ROOT}[{args.extras}]" if args.extras else str(ROOT)
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report",
               str(report), "--target", str(folder / "never"), *target_args(args), "-c", str(constraints), project]  # fmt: skip
    subprocess.run(command, check=True, env={"PIP_CONSTRAINT": "", **_env()})
    installs = json.loads(report.read_text())["install"]
    return {canonical(item["metadata"]["name"]): item["metadata"]["version"] for item in installs}


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("wheelhouse"))
    parser.add_argument("--python-version", default="3.12", help="the target's Python (default 3.12)")
    parser.add_argument("--platform", default="manylinux_2_28_x86_64", help="the target's wheel platform tag")
    parser.add_argument("--have", type=Path, default=None, help="the target's `pip list --format=freeze`")
    parser.add_argument("--extras", default="", help="project extras to include, e.g. 'dev'")
    args = parser.parse_args(argv)
    if args.have is not None and not args.have.is_file():
        print(f"error: --have {args.have}: no such file; write it on the target with pip list --format=freeze",
              file=sys.stderr)  # fmt: skip
        return 2
    have = read_have(args.have)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        resolved = resolve(args, target_constraints(have, folder), folder)
    project = canonical("unirl")
    needed = {name: version for name, version in resolved.items() if name not in have and name != project}
    pins = [f"{name}=={version}" for name, version in sorted(needed.items())]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", *target_args(args),
                    "-d", str(args.out), *pins], check=True, env={"PIP_CONSTRAINT": "", **_env()})  # fmt: skip
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(args.out), str(ROOT)],
                   check=True)  # fmt: skip
    lines = [f"{name}=={version}" for name, version in sorted(resolved.items()) if name != project]
    (args.out / "requirements.txt").write_text("\n".join([*lines, "unirl"]) + "\n")
    size = sum(p.stat().st_size for p in args.out.glob("*.whl")) / 2**20
    print(f"{args.out}: {len(needed)} wheels downloaded + unirl's ({size:.0f} MiB); {len(resolved) - len(needed) - 1} "
          f"packages the target has were skipped; install with pip install --no-index --find-links {args.out} "
          f"-r {args.out}/requirements.txt")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
