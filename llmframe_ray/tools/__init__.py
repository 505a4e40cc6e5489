"""Agent tools over the served HTTP API: tool definitions (MCP, OpenAI, Anthropic) and the MCP server."""
