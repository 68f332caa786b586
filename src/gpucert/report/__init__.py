"""One JSON report per run and its renderings (terminal table, Markdown)."""
