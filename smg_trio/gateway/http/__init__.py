"""The HTTP front: the quart-trio app and route table, per-request bookkeeping, the inference
handlers, the stream body, probes, metrics and the OpenAPI document."""
