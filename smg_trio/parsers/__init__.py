"""Model-output parsers: tool calls and reasoning split out of generated text, streaming."""
