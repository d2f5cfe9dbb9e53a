"""replaybench implementations: priority structures, storage, buffers and their registry."""
