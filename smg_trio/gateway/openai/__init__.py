"""OpenAI semantics with no HTTP framework: request schemas, translation to engine requests,
the per-choice text pipeline, fan-out, logprobs, rendering and the error envelope."""
