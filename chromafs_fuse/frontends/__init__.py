"""Front ends over a reader's view of a site: the sandboxed shell, the MCP server."""
