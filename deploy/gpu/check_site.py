"""After install_wheelhouse.sh: does what Python finds first (the site folder on PYTHONPATH, then the image) meet
the requirements of the roots, all the way down?

    PYTHONPATH=SITE python3 check_site.py IMAGE_PACKAGES ROOT...

Prints each requirement met by another version than it asks for (the recipe in build_wheelhouse.sh accepts some:
its ACCEPT list) and each one missing. Exits 1 when one is missing that image-packages.txt does not leave out on
purpose: the wheelhouse, or the image, lacks it, and the engine would fail when it first imports it.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

from pip._vendor.packaging.requirements import Requirement
from wheelhouse_pins import image_packages, norm


def problems(roots: list[str], left_out: set[str]) -> tuple[list[str], list[str]]:
    """(requirements met by another version, requirements missing), each as 'WHO wants REQ: WHAT'."""
    other, missing = set(), set()
    todo = [(Requirement(r), "root") for r in roots]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req, by = todo.pop()
        name = norm(req.name)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            if name not in left_out:
                missing.add(f"{by} wants {req}: not found")
            continue
        where = Path(str(dist.locate_file("")))
        if req.specifier and not req.specifier.contains(dist.version, prereleases=True):
            other.add(f"{by} wants {req}: {dist.version} in {where}")
        if (name, frozenset(req.extras)) in done:
            continue
        done.add((name, frozenset(req.extras)))
        for spec in dist.requires or []:
            dep = Requirement(spec)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in {"", *req.extras}):
                todo.append((dep, norm(dist.metadata["Name"])))
    return sorted(other), sorted(missing)


def main() -> None:
    _, left_out = image_packages(sys.argv[1])
    other, missing = problems(sys.argv[2:], left_out)
    for line in other:
        print(f"other version: {line}")
    for line in missing:
        print(f"MISSING: {line}")
    print(f"{len(other)} met by another version, {len(missing)} missing")
    sys.exit(1 if missing else 0)


if __name__ == "__main__":
    main()
