"""`gpustack-dspark`: the package's command line. Talks to GPUStack over HTTP only; never
imports the server plugin (plugin, placement, routing, observe)."""
