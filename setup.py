"""Install the three top-level folders under one name: ``impl/`` -> ``replaybench.impl``, etc.

The design keeps impl/, bench/ and analysis/ at the top of the repository (what is measured,
how, what it means), but top-level packages with those names would collide with anything in a
user's environment. setuptools' ``package_dir`` maps each folder to a subpackage of
``replaybench`` (editable installs included: setuptools' editable finder honours the mapping),
and the package list is derived from the folders, so a new subpackage needs no edit here.
Everything else is declared in pyproject.toml.
"""

from setuptools import find_packages, setup

FOLDERS = ("impl", "bench", "analysis", "adapters")

setup(
    packages=["replaybench"] + [f"replaybench.{p}" for p in find_packages(include=[f"{f}*" for f in FOLDERS])],
    package_dir={"replaybench": "replaybench", **{f"replaybench.{f}": f for f in FOLDERS}},
)
