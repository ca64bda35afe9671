"""Which resolved packages the wheelhouse carries: those the GPU image lacks or has at a version that won't do.

    python3 wheelhouse_pins.py REPORT IMAGE_PACKAGES [--accept NAME]... [--carry NAME]... -- ROOT_REQUIREMENT...

REPORT is `pip install --dry-run --report` for the target platform; IMAGE_PACKAGES lists the image's packages
(`name`, or `name==version` where the version is known), then, after a comment line that says "left out", the
ones left out on purpose. The walk starts at the roots and stops at a package the image has at a version the
requirement accepts (or at an unknown version), at one left out, and at one named by --accept (the image's
version is taken though the pin asks for another; the recipe says why), so their own dependencies stay out too.
--carry NAME carries the resolved version of an image package whatever the image has (a small one whose image
version is unknown but may be too old). Prints the `name==version` lines to carry; what it decided about the
image's packages goes to stderr. Exits 1 if a requirement that applies to the target is missing from REPORT: pip
evaluates markers such as `python_version > "3.11"` for the interpreter that resolves, whatever --python-version
says, so a resolution run by another Python leaves such packages out.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from pip._vendor.packaging.requirements import Requirement

TARGET = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
          "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
          "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}  # fmt: skip


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages(path: str) -> tuple[dict[str, str | None], set[str]]:
    """(name -> the image's version or None where only the name is known, the names left out on purpose)."""
    image: dict[str, str | None] = {}
    left_out: set[str] = set()
    section: dict[str, str | None] | set[str] = image
    for line in Path(path).read_text().splitlines():
        if line.startswith("#"):
            section = left_out if "left out" in line else section
            continue
        for word in line.split():
            name, _, version = word.partition("==")
            if isinstance(section, set):
                section.add(norm(name))
            else:
                section[norm(name)] = version or None
    return image, left_out


def carried(
    report: dict, image_file: str, accept: set[str], carry: set[str], roots: list[str]
) -> tuple[list[str], list[str]]:
    """(`name==version` to carry, notes on the image's packages that a requirement pins but the walk kept)."""
    image, left_out = image_packages(image_file)
    image = {name: version for name, version in image.items() if name not in carry}
    found = {norm(i["metadata"]["name"]): i["metadata"] for i in report["install"]}
    todo = [(Requirement(r), "root") for r in roots]
    keep: set[str] = set()
    notes: set[str] = set()
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:  # a requirement like pkg[extra] pulls the extra's dependencies too
        req, by = todo.pop()
        name = norm(req.name)
        if name in left_out:
            continue
        if name in image and name not in keep:
            have = image[name]
            if have is None or name in accept or req.specifier.contains(have, prereleases=True):
                if req.specifier and (have is None or name in accept):
                    how = f"accepted: the image's {have}" if name in accept else "the image's version unknown"
                    notes.add(f"{by} wants {req}: {how}")
                continue
            notes.add(f"{by} wants {req}: carried, the image's {have} does not meet it")
        if name not in found:
            notes.add(f"{by} wants {req}: NOT RESOLVED")
            continue
        key = (name, frozenset(req.extras))
        if key in done:
            continue
        done.add(key)
        keep.add(name)
        for spec in found[name].get("requires_dist") or []:
            dep = Requirement(spec)
            extras = {"", *req.extras}
            if dep.marker is None or any(dep.marker.evaluate(TARGET | {"extra": e}) for e in extras):
                todo.append((dep, name))
    return sorted(f"{found[n]['name']}=={found[n]['version']}" for n in keep), sorted(notes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report")
    ap.add_argument("image_packages")
    ap.add_argument("--accept", action="append", default=[], help="take the image's version of NAME")
    ap.add_argument("--carry", action="append", default=[], help="carry NAME though the image has it")
    ap.add_argument("roots", nargs="+")
    args = ap.parse_args()
    accept, carry = {norm(a) for a in args.accept}, {norm(c) for c in args.carry}
    pins, notes = carried(json.loads(Path(args.report).read_text()), args.image_packages, accept, carry, args.roots)
    print("\n".join(notes), file=sys.stderr)
    print("\n".join(pins))
    if any(n.endswith("NOT RESOLVED") for n in notes):
        sys.exit(1)


if __name__ == "__main__":
    main()
