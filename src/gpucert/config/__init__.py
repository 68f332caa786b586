"""Typed configuration: dataclasses are the schema, YAML fills them, the CLI overrides them."""
