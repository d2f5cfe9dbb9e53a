"""replaybench: prioritized-replay data structures and the parallel actor/learner loops that use them.

The installed package holds the project's three top-level folders as subpackages
(``replaybench.impl``: what is measured, ``replaybench.bench``: how, ``replaybench.analysis``:
what it means; see pyproject.toml for the mapping). The registry's public API is re-exported
here, so a user's code reads::

    from replaybench import create, names
    buf = create("kary-aligned", capacity=2**20, fields={...}, alpha=0.6)

The names are resolved on first use (PEP 562), so importing a subpackage (``replaybench.analysis``
reads stored results and must not load the tree kernels) costs nothing of impl/.
"""

__all__ = ["ENTRY_POINT_GROUP", "create", "get", "names", "register", "register_tree"]


def __getattr__(name: str):
    if name in __all__:
        from replaybench.impl import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'replaybench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
