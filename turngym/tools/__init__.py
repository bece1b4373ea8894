"""Tools the agent can call, the call formats (parse and render), and sandboxes."""

from turngym.tools.base import Tool, ToolRegistry, ToolTimeout, schema_from_signature, tool, truncate
from turngym.tools.formats import FORMATS, ParsedAction, ToolFormat, get_format, register_format, run_tools

__all__ = [
    "Tool", "ToolRegistry", "ToolTimeout", "tool", "schema_from_signature", "truncate",
    "FORMATS", "ParsedAction", "ToolFormat", "get_format", "register_format", "run_tools",
]
