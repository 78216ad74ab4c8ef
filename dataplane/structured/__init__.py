"""Structured outputs: decoding constrained to a JSON schema, JSON, a regex, a choice or an EBNF grammar."""
