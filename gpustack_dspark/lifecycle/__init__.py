"""Replica lifecycle repairs on the server side: `missed_start` (pure) and its glue
`gpustack_patches`."""
