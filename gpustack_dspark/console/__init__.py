"""The DSpark console inside GPUStack's web UI: pure cores (`series`, `figures`, `view`,
`editor`) and thin glue (`sampler`, `routes`, `index_inject`)."""
