"""Packaging: every code folder installs, so what runs in a clean clone is what the tests import."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE_FOLDERS = ("prefill", "decode", "proxy", "connector")


def test_every_code_folder_is_a_listed_package():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = {setup["package-dir"][name]: name for name in setup["packages"]}
    folders = {str(d.relative_to(ROOT)) for top in CODE_FOLDERS for d in [ROOT / top, *(ROOT / top).rglob("*")]
               if d.is_dir() and any(d.glob("*.py")) and "__pycache__" not in d.parts}
    assert folders <= set(listed), f"add to pyproject.toml packages/package-dir: {sorted(folders - set(listed))}"
    for folder, name in listed.items():
        assert name == "hybrid_pd." + folder.replace("/", "."), name


def test_the_installed_package_is_this_checkout():
    import hybrid_pd.prefill

    assert Path(hybrid_pd.prefill.__file__).resolve().parent == ROOT / "prefill"
