"""replaybench: prioritized-replay data structures and the parallel actor/learner loops that use them.

The installed package holds the project's three top-level folders as subpackages
(``replaybench.impl``: what is measured, ``replaybench.bench``: how, ``replaybench.analysis``:
what it means; see pyproject.toml for the mapping). The registry's public API is re-exported
here, so a user's code reads::

    from replaybench import create, names
    buf = create("kary-aligned", capacity=2**20, fields={...}, alpha=0.6)
"""

from replaybench.impl.registry import ENTRY_POINT_GROUP, create, get, names, register, register_tree

__all__ = ["ENTRY_POINT_GROUP", "create", "get", "names", "register", "register_tree"]
