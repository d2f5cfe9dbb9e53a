"""One module per variant family; each registers itself on import (see impl.registry).

To add a variant, drop a module here that calls ``registry.register_tree`` or
``registry.register``; nothing else needs editing. docs/extending.md walks through an example (examples/variant_line_per_group.py).
"""
